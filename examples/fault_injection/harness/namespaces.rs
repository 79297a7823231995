//! The plumbing of the network namespaces that stand for hosts, shared by the soak's
//! partition fault and the partition tests (which include this file): running `ip`, naming
//! what a process makes so that a later run can tell whose it is, and removing what a run
//! whose process is gone left behind.
//!
//! Names are `rmx`, the process id in base 36, `-`, a counter and a kind letter (`b` bridge,
//! `v<i>` veth, `h<i>` namespace, `p` probe): at most 15 bytes, an interface name's limit.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

const PREFIX: &str = "rmx";

/// Whether this process is root and `ip` runs; the error says which is missing.
pub fn root_and_ip() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let ip_found = Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if root && ip_found {
        Ok(())
    } else {
        Err(format!(
            "root: {root}, `ip` found: {ip_found}; on Debian, `apt-get install iproute2`"
        ))
    }
}

/// Runs `ip ARGS`; the error carries its stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// What `ip ARGS` printed; empty when it failed.
pub fn ip_output(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn base36(mut n: u32) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii")
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// `rmx<pid36>-<n>`: unique in this process, and among processes; a kind letter follows.
pub fn next_id() -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{PREFIX}{}-{n}", base36(std::process::id()))
}

/// The process that made `name`, when `name` is one of ours.
fn owner_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, tail) = rest.split_once('-')?;
    let digits = tail.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 || !matches!(tail[digits..].chars().next(), Some('b' | 'v' | 'h' | 'p')) {
        return None;
    }
    u32::from_str_radix(pid, 36).ok()
}

fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// SIGKILLs every process in namespace `ns`.
pub fn kill_namespace_processes(ns: &str) {
    for pid in ip_output(&["netns", "pids", ns]).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Removes the namespaces (and their processes) and links of runs whose process is gone;
/// once per process.
pub fn remove_stale() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for line in ip_output(&["netns", "list"]).lines() {
            let Some(name) = line.split_whitespace().next() else {
                continue;
            };
            if owner_of(name).is_some_and(|pid| !process_alive(pid)) {
                kill_namespace_processes(name);
                let _ = ip(&["netns", "del", name]);
            }
        }
        for line in ip_output(&["-o", "link", "show"]).lines() {
            // `7: rmx1a2b-0v1@if2: <…` — the name is the second field, before any `@`.
            let Some(field) = line.split_whitespace().nth(1) else {
                continue;
            };
            let name = field.trim_end_matches(':');
            let name = name.split('@').next().unwrap_or(name);
            if owner_of(name).is_some_and(|pid| !process_alive(pid)) {
                let _ = ip(&["link", "del", name]);
            }
        }
    });
}

/// A 10.x.y.0/24 with x in `xs` that no address or route of this machine uses, from a
/// random start (several processes at once take different ones); `None` when all are used.
pub fn free_subnet(xs: std::ops::Range<u32>) -> Option<(u32, u32)> {
    let span = (xs.end - xs.start) * 256;
    let used = ip_output(&["-o", "-4", "addr", "show"]) + &ip_output(&["-4", "route", "show"]);
    let start = std::process::id()
        .wrapping_mul(97)
        .wrapping_add(fastrand::u32(..))
        % span;
    (0..span).find_map(|k| {
        let v = (start + k) % span;
        let (x, y) = (xs.start + v / 256, v % 256);
        (!used.contains(&format!("10.{x}.{y}."))).then_some((x, y))
    })
}
