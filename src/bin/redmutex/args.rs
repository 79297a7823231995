//! The command line: what to do, where, and how to print it (clap's derive: help on stdout,
//! `--version`, usage errors with exit status 2).

use std::time::Duration;

use clap::{Parser, Subcommand};

/// What the exit statuses mean, printed under the help.
const AFTER_HELP: &str = "\
Credentials: in the URL, or $REDIS_USERNAME and $REDIS_PASSWORD; never printed.
Exit status: 0 done, 2 bad usage (a bad option, command or lock name), 3 Redis unreachable or
refused, 4 nothing to unlock, 5 unlock declined.";

/// Who holds what: the locks a redmutex application keeps in Redis, with their holders
/// (client name, host, process, thread), leases, fencing counters and waiters.
#[derive(Debug, Parser)]
#[command(name = "redmutex", version, after_help = AFTER_HELP)]
pub struct Args {
    /// Where Redis is: redis://, rediss://, redis+sentinel:// or redis+cluster://
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1/",
        global = true,
        hide_env_values = true
    )]
    pub url: String,
    /// The key prefix the locks use [default: redmutex]
    #[arg(long, global = true)]
    pub prefix: Option<String>,
    /// Print JSON (one object; `watch` prints one per line)
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// The locks whose names match PATTERN
    List {
        /// A glob over lock names
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// One lock: holders, leases, fencing counter, waiters
    Show {
        #[arg(value_parser = lock_name)]
        name: String,
    },
    /// Acquires and releases of a lock as they happen
    Watch {
        #[arg(value_parser = lock_name)]
        name: String,
        /// Stop after this many seconds
        #[arg(long = "for", value_name = "SECS", value_parser = seconds)]
        limit: Option<Duration>,
    },
    /// Who leads an election: value, term, since when, holder process
    Leader {
        #[arg(value_parser = lock_name)]
        name: String,
        /// Print every change of leader as it happens
        #[arg(long)]
        watch: bool,
        /// With --watch: stop after this many seconds
        #[arg(long = "for", value_name = "SECS", value_parser = seconds)]
        limit: Option<Duration>,
    },
    /// Delete a lock whoever holds it, and wake its waiters
    Unlock {
        #[arg(value_parser = lock_name)]
        name: String,
        /// Do not ask first
        #[arg(short, long)]
        yes: bool,
    },
}

/// A lock name: not empty.
fn lock_name(s: &str) -> Result<String, String> {
    match s.is_empty() {
        true => Err("a lock name must not be empty".to_owned()),
        false => Ok(s.to_owned()),
    }
}

/// A positive number of seconds.
fn seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 => Ok(Duration::from_secs_f64(secs)),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

impl Args {
    /// `url` with `$REDIS_USERNAME` / `$REDIS_PASSWORD` put in, when it carries none itself.
    pub fn with_credentials(mut self) -> Self {
        self.url = with_credentials(&self.url);
        self
    }
}

fn with_credentials(url: &str) -> String {
    let user = std::env::var("REDIS_USERNAME").unwrap_or_default();
    let password = std::env::var("REDIS_PASSWORD").unwrap_or_default();
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if (user.is_empty() && password.is_empty()) || authority.contains('@') {
        return url.to_owned();
    }
    let userinfo = match password.is_empty() {
        true => percent_encode(&user),
        false => format!("{}:{}", percent_encode(&user), percent_encode(&password)),
    };
    format!("{scheme}://{userinfo}@{rest}")
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(line: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("redmutex").chain(line.split_whitespace()))
    }

    #[test]
    fn commands_and_options_are_read() {
        let a = parse_words("--url redis://h:1/ --json list orders:*").unwrap();
        assert_eq!(a.url, "redis://h:1/");
        assert!(a.json);
        assert_eq!(
            a.command,
            Command::List {
                pattern: "orders:*".into()
            }
        );
        // Options go before or after the command.
        let a = parse_words("unlock x --yes --url redis://h/").unwrap();
        assert_eq!(a.url, "redis://h/");
        assert_eq!(
            a.command,
            Command::Unlock {
                name: "x".into(),
                yes: true
            }
        );
        let a = parse_words("--url redis://h/ watch x --for 1.5").unwrap();
        assert_eq!(
            a.command,
            Command::Watch {
                name: "x".into(),
                limit: Some(Duration::from_millis(1500))
            }
        );
        assert!(parse_words("--url redis://h/ show").is_err());
        assert!(parse_words("--url redis://h/ frob x").is_err());
        assert!(parse_words("--url redis://h/ watch x --for -1").is_err());
        assert!(parse_words("--url redis://h/ watch x --for 0").is_err());
    }

    #[test]
    fn an_empty_lock_name_is_a_usage_error() {
        let err = Args::try_parse_from(["redmutex", "show", ""]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("must not be empty"), "{err}");
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }
}
