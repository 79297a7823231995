//! The command line: what to do, where, and how to print it.

use std::time::Duration;

pub const USAGE: &str = "\
usage: redmutex [--url URL] [--prefix PREFIX] [--json] COMMAND

commands:
  list [PATTERN]             the locks whose names match PATTERN (a glob; default *)
  show NAME                  one lock: holders, leases, fencing counter, waiters
  watch NAME [--for SECS]    acquires and releases of NAME as they happen
  unlock NAME [--yes]        delete NAME's lock whoever holds it, and wake its waiters

options:
  --url URL        where Redis is (redis://, rediss://, redis+sentinel://, redis+cluster://);
                   default $REDIS_URL, else redis://127.0.0.1/
  --prefix PREFIX  the key prefix the locks use (default redmutex)
  --json           print JSON (one object; `watch` prints one per line)

credentials: in the URL, or $REDIS_USERNAME and $REDIS_PASSWORD; never printed.
exit status: 0 done, 2 bad usage, 3 Redis unreachable or refused, 4 nothing to unlock,
5 unlock declined.";

/// What to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    List {
        pattern: String,
    },
    Show {
        name: String,
    },
    Watch {
        name: String,
        limit: Option<Duration>,
    },
    Unlock {
        name: String,
        yes: bool,
    },
}

/// The whole command line.
#[derive(Debug)]
pub struct Args {
    pub url: String,
    pub prefix: Option<String>,
    pub json: bool,
    pub command: Command,
}

/// Reads the command line (without the program's name).
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut url = None;
    let mut prefix = None;
    let mut json = false;
    let mut yes = false;
    let mut limit = None;
    let mut words = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--url" => url = Some(it.next().ok_or("--url needs a value")?),
            "--prefix" => prefix = Some(it.next().ok_or("--prefix needs a value")?),
            "--json" => json = true,
            "--yes" | "-y" => yes = true,
            "--for" => {
                let secs: f64 = it
                    .next()
                    .ok_or("--for needs a number of seconds")?
                    .parse()
                    .map_err(|_| "--for needs a number of seconds")?;
                if !(secs.is_finite() && secs > 0.0) {
                    return Err("--for needs a positive number of seconds".into());
                }
                limit = Some(Duration::from_secs_f64(secs));
            }
            "-h" | "--help" => return Err(String::new()),
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            _ => words.push(arg),
        }
    }
    let mut words = words.into_iter();
    let verb = words.next().ok_or("no command given")?;
    let mut name = || words.next().ok_or(format!("{verb} needs a lock name"));
    let command = match verb.as_str() {
        "list" => Command::List {
            pattern: words.next().unwrap_or_else(|| "*".to_owned()),
        },
        "show" => Command::Show { name: name()? },
        "watch" => Command::Watch {
            name: name()?,
            limit,
        },
        "unlock" => Command::Unlock { name: name()?, yes },
        other => return Err(format!("unknown command {other}")),
    };
    let url = url
        .or_else(|| std::env::var("REDIS_URL").ok())
        .unwrap_or_else(|| "redis://127.0.0.1/".to_owned());
    Ok(Args {
        url: with_credentials(&url),
        prefix,
        json,
        command,
    })
}

/// `url` with `$REDIS_USERNAME` / `$REDIS_PASSWORD` put in, when it carries none itself.
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

    fn parse_words(line: &str) -> Result<Args, String> {
        parse(line.split_whitespace().map(str::to_owned))
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
        let a = parse_words("--url redis://h/ unlock x --yes").unwrap();
        assert_eq!(
            a.command,
            Command::Unlock {
                name: "x".into(),
                yes: true
            }
        );
        assert!(parse_words("--url redis://h/ show").is_err());
        assert!(parse_words("--url redis://h/ frob x").is_err());
        assert!(parse_words("--url redis://h/ watch x --for -1").is_err());
    }
}
