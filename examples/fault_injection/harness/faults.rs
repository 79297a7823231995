//! The faults the driver injects.

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the process that holds the lock; a new process takes its place.
    KillHolder,
    /// SIGSTOP the process that holds the lock for longer than the lease, then SIGCONT.
    StopHolder,
    /// Take the lock's master away: a standalone Redis is killed and started again, empty;
    /// under Sentinel its replica is promoted (`SENTINEL FAILOVER`); in a Cluster the master
    /// is killed (SIGKILL) and the cluster promotes its replica on its own.
    LoseMaster,
    /// `CLIENT KILL` every client connection of the lock's Redis, pub/sub ones included.
    KillConnections,
    /// `DEBUG SLEEP` the lock's Redis for longer than the lease.
    SleepRedis,
}

impl Fault {
    /// Every kind, in the order a round injects them before shuffling.
    pub const ALL: [Fault; 5] = [
        Fault::KillHolder,
        Fault::StopHolder,
        Fault::LoseMaster,
        Fault::KillConnections,
        Fault::SleepRedis,
    ];

    /// The name the history records.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillHolder => "kill-holder",
            Fault::StopHolder => "stop-holder",
            Fault::LoseMaster => "lose-master",
            Fault::KillConnections => "client-kill",
            Fault::SleepRedis => "debug-sleep",
        }
    }
}

/// Sends `signal` to `pid`.
pub fn signal(pid: u32, signal: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
