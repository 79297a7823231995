//! redis-py from PyPI, for the tests and benchmarks that run it beside redmutex.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Where redis-py is installed (once per build directory): put it on `PYTHONPATH`.
pub fn redis_py() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("python-redis");
        if !dir.join("redis").join("__init__.py").exists() {
            let install = |extra: &[&str]| {
                Command::new("python3")
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                    ])
                    .args(extra)
                    .arg("--target")
                    .arg(&dir)
                    .arg("redis>=4.5,<7")
                    .env("PIP_ROOT_USER_ACTION", "ignore")
                    .status()
                    .expect("python3 with pip (scripts/ensure-redis installs them)")
                    .success()
            };
            // A Debian Python refuses installs it does not manage unless told.
            let installed = install(&[]) || install(&["--break-system-packages"]);
            assert!(installed, "pip could not install redis-py");
        }
        dir
    })
}
