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
    /// Cut the host of the lock's master (a network namespace, with a sentinel or other
    /// masters' nodes and worker processes) off from the other hosts — not from the fenced
    /// resource — preferably while a worker on it holds the lock, until the other side has
    /// failed over and another worker took the lock; then heal. Sentinel and Cluster only,
    /// on hosts (see [`super::netns`]).
    Partition,
}

impl Fault {
    /// Every kind that needs no hosts, in the order a round injects them before shuffling.
    pub const ALL: [Fault; 5] = [
        Fault::KillHolder,
        Fault::StopHolder,
        Fault::LoseMaster,
        Fault::KillConnections,
        Fault::SleepRedis,
    ];

    /// [`ALL`](Fault::ALL) and a partition.
    pub const WITH_PARTITION: [Fault; 6] = [
        Fault::KillHolder,
        Fault::StopHolder,
        Fault::LoseMaster,
        Fault::KillConnections,
        Fault::SleepRedis,
        Fault::Partition,
    ];

    /// The name the history records.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillHolder => "kill-holder",
            Fault::StopHolder => "stop-holder",
            Fault::LoseMaster => "lose-master",
            Fault::KillConnections => "client-kill",
            Fault::SleepRedis => "debug-sleep",
            Fault::Partition => "partition",
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
