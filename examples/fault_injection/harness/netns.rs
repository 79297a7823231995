//! "Hosts" for the partition fault: Linux network namespaces, each attached by a veth pair to
//! one bridge in the root namespace. The bridge has an address too, so the root namespace —
//! the driver and the fenced resource — reaches every host, before, during and after a cut.
//!
//! A host is cut off from the OTHER HOSTS ONLY, not from the root namespace, with blackhole
//! routes: in the cut host one to each other host's address, and in each other host one to
//! the cut host's. Every packet between them is dropped (a new connection fails at once, an
//! established one hears nothing more), while the cut host's traffic with the root namespace
//! goes on, so that workers cut off with the master still write to the resource. Healing
//! deletes the routes. The routes are written on a `NETLINK_ROUTE` socket opened in each
//! namespace beforehand (what `ip route add blackhole …` sends), so that a cut is in place
//! well within a millisecond of the driver's decision: a hold lasts a few milliseconds.
//!
//! Needs Linux, root and iproute2 (`ip`): [`unavailable`] says why not. What a run that is
//! gone left behind (namespaces, the processes in them, links) is removed by the next
//! (`namespaces`). Everything a [`Net`] made — the
//! processes in its namespaces, the routes, the veths, the namespaces and the bridge — is
//! removed when it is dropped.

use std::cell::Cell;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;

use super::namespaces::{
    free_subnet, ip, kill_namespace_processes, next_id, remove_stale, root_and_ip,
};
use super::AnyResult;

/// Why network namespaces cannot be made here (not root, no `ip`, or the kernel refuses);
/// `None` when they can.
pub fn unavailable() -> Option<String> {
    if !cfg!(target_os = "linux") {
        return Some("the partition fault needs Linux network namespaces".to_owned());
    }
    if let Err(missing) = root_and_ip() {
        return Some(format!(
            "the partition fault needs root and iproute2 for network namespaces ({missing})"
        ));
    }
    remove_stale();
    let probe = format!("{}p", next_id());
    if let Err(e) = ip(&["netns", "add", &probe]) {
        return Some(format!(
            "the partition fault needs network namespaces, which cannot be made here: {e}"
        ));
    }
    let _ = ip(&["netns", "del", &probe]);
    None
}

/// One host: a network namespace whose `eth0` is on the bridge.
struct Host {
    ns: String,
    /// The root-namespace end of its veth pair, a port of the bridge.
    veth: String,
    ip: Ipv4Addr,
    /// Writes the host's routes.
    routes: Option<linux::RouteSocket>,
}

/// A bridge and the hosts on it. Dropping it kills every process in its hosts and removes
/// the routes, the namespaces, the veth pairs and the bridge.
pub struct Net {
    id: String,
    bridge: Option<String>,
    gateway: String,
    hosts: Vec<Host>,
    /// The host cut off now.
    cut: Cell<Option<usize>>,
}

impl Net {
    /// Makes a bridge with `hosts` hosts on it, on a /24 of its own.
    pub fn new(hosts: usize) -> AnyResult<Net> {
        assert!((1..=9).contains(&hosts), "1 to 9 hosts");
        remove_stale();
        let id = next_id();
        // The longest interface name made here is a veth's, `<id>v<i>`.
        if id.len() + 2 > 15 {
            return Err(format!("{id} is too long for an interface name").into());
        }
        // Away from the partition tests' 100..250.
        let (x, y) = free_subnet(60..100).ok_or("no free 10.x.y.0/24 subnet for the hosts")?;
        let mut net = Net {
            bridge: None,
            gateway: format!("10.{x}.{y}.1"),
            hosts: Vec::new(),
            cut: Cell::new(None),
            id,
        };
        let bridge = format!("{}b", net.id);
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        net.bridge = Some(bridge.clone());
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.gateway),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..hosts {
            let host = Host {
                ns: format!("{}h{i}", net.id),
                veth: format!("{}v{i}", net.id),
                ip: Ipv4Addr::new(10, x as u8, y as u8, 10 + i as u8),
                routes: None,
            };
            ip(&["netns", "add", &host.ns])?;
            let (ns, veth) = (host.ns.clone(), host.veth.clone());
            // Pushed now: a failure below still removes it.
            net.hosts.push(host);
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            ip(&["link", "set", &veth, "master", &bridge])?;
            ip(&["link", "set", &veth, "up"])?;
            let address = format!("{}/24", net.hosts[i].ip);
            ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            net.hosts[i].routes = Some(linux::RouteSocket::open_in(&ns)?);
        }
        Ok(net)
    }

    /// How many hosts there are.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// The root namespace's address on the bridge.
    pub fn gateway(&self) -> &str {
        &self.gateway
    }

    /// Host `i`'s address.
    pub fn ip(&self, i: usize) -> String {
        self.hosts[i].ip.to_string()
    }

    /// Host `i`'s network namespace.
    pub fn namespace(&self, i: usize) -> &str {
        &self.hosts[i].ns
    }

    /// `command` run inside host `i` instead (`ip netns exec NS PROGRAM ARGS…`, which execs
    /// the program: the child's pid is the program's), with its environment.
    pub fn wrap(&self, i: usize, command: &Command) -> Command {
        let mut wrapped = Command::new("ip");
        wrapped
            .args(["netns", "exec", &self.hosts[i].ns])
            .arg(command.get_program())
            .args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped
    }

    /// The blackhole routes that cut host `h` off from the others: the host whose routes,
    /// and the address; the cut host's first.
    fn routes(&self, h: usize) -> Vec<(usize, Ipv4Addr)> {
        let others = (0..self.hosts.len()).filter(|&j| j != h);
        let out = others.clone().map(|j| (h, self.hosts[j].ip));
        let back = others.map(|j| (j, self.hosts[h].ip));
        out.chain(back).collect()
    }

    /// Adds (`add`) or deletes host `h`'s blackhole routes.
    fn blackholes(&self, h: usize, add: bool) -> AnyResult<()> {
        for (host, to) in self.routes(h) {
            let socket = self.hosts[host].routes.as_ref().ok_or("no route socket")?;
            socket.blackhole(add, to).map_err(|e| {
                format!(
                    "{} the blackhole route to {to} in host {host}: {e}",
                    if add { "adding" } else { "deleting" }
                )
            })?;
        }
        Ok(())
    }

    /// Cuts host `h` off from every other host (not from the root namespace).
    pub fn cut(&self, h: usize) -> AnyResult<()> {
        if let Some(cut) = self.cut.get() {
            return Err(format!("host {cut} is cut off already").into());
        }
        self.cut.set(Some(h));
        self.blackholes(h, true)
    }

    /// Undoes [`cut`](Net::cut).
    pub fn heal(&self) -> AnyResult<()> {
        match self.cut.take() {
            Some(h) => self.blackholes(h, false),
            None => Ok(()),
        }
    }

    /// Checks with TCP connections what the hosts reach: every host reaches the root
    /// namespace (`root_port` on the bridge address); hosts reach each other (`port` on each
    /// host's address) except across a cut.
    pub fn check(&self, port: u16, root_port: u16) -> AnyResult<()> {
        let cut = self.cut.get();
        let root: SocketAddr = format!("{}:{root_port}", self.gateway).parse()?;
        for (i, host) in self.hosts.iter().enumerate() {
            linux::connect_from(&host.ns, root)
                .map_err(|e| format!("host {i} does not reach the root namespace: {e}"))?;
            for (j, other) in self.hosts.iter().enumerate() {
                if i == j {
                    continue;
                }
                let to: SocketAddr = format!("{}:{port}", other.ip).parse()?;
                let across = cut.is_some_and(|c| c == i || c == j);
                match (linux::connect_from(&host.ns, to), across) {
                    (Ok(()), true) => {
                        return Err(format!("host {i} still reaches host {j} across the cut").into())
                    }
                    (Err(e), false) => {
                        return Err(format!("host {i} does not reach host {j}: {e}").into())
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// What needs Linux: joining a network namespace (`setns`) from a thread, and writing
/// routes with netlink.
#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::net::{Ipv4Addr, SocketAddr, TcpStream};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Duration;

    use super::AnyResult;

    /// Runs `f` in a thread that joined network namespace `ns`.
    fn in_namespace<T: Send + 'static>(
        ns: &str,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let path = format!("/var/run/netns/{ns}");
        std::thread::spawn(move || {
            let file = std::fs::File::open(path)?;
            // SAFETY: setns(2) on a namespace file we opened; it changes this thread's
            // network namespace only, and the thread ends after `f`.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("a thread in a namespace panicked")))
    }

    /// A TCP connection to `to` from inside namespace `ns`.
    pub fn connect_from(ns: &str, to: SocketAddr) -> io::Result<()> {
        in_namespace(ns, move || {
            TcpStream::connect_timeout(&to, Duration::from_millis(500)).map(drop)
        })
    }

    // rtnetlink, from <linux/netlink.h> and <linux/rtnetlink.h>.
    const RTM_NEWROUTE: u16 = 24;
    const RTM_DELROUTE: u16 = 25;
    const NLMSG_ERROR: u16 = 2;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_ACK: u16 = 0x4;
    const NLM_F_EXCL: u16 = 0x200;
    const NLM_F_CREATE: u16 = 0x400;
    const RT_TABLE_MAIN: u8 = 254;
    const RTPROT_BOOT: u8 = 3;
    const RT_SCOPE_UNIVERSE: u8 = 0;
    const RT_SCOPE_NOWHERE: u8 = 255;
    const RTN_BLACKHOLE: u8 = 6;
    const RTA_DST: u16 = 1;

    /// A `NETLINK_ROUTE` socket opened inside a namespace: it writes that namespace's routes.
    pub struct RouteSocket(OwnedFd);

    impl RouteSocket {
        pub fn open_in(ns: &str) -> AnyResult<RouteSocket> {
            let fd = in_namespace(ns, || {
                // SAFETY: socket(2) has no memory-safety preconditions.
                let fd = unsafe {
                    libc::socket(
                        libc::AF_NETLINK,
                        libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                        libc::NETLINK_ROUTE,
                    )
                };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: `fd` is a socket just opened, owned by nothing else.
                Ok(unsafe { OwnedFd::from_raw_fd(fd) })
            })
            .map_err(|e| format!("opening a netlink socket in {ns}: {e}"))?;
            Ok(RouteSocket(fd))
        }

        /// Adds (`add`) or deletes the route `blackhole <to>/32` in the main table, as `ip
        /// route add|del blackhole <to>/32` does; waits for the kernel's answer.
        pub fn blackhole(&self, add: bool, to: Ipv4Addr) -> io::Result<()> {
            let (kind, flags, protocol, scope) = match add {
                true => (
                    RTM_NEWROUTE,
                    NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                    RTPROT_BOOT,
                    RT_SCOPE_UNIVERSE,
                ),
                false => (RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK, 0, RT_SCOPE_NOWHERE),
            };
            let seq = fastrand::u32(..);
            let mut msg = Vec::with_capacity(36);
            // struct nlmsghdr: length, type, flags, sequence, port id.
            msg.extend(36u32.to_ne_bytes());
            msg.extend(kind.to_ne_bytes());
            msg.extend(flags.to_ne_bytes());
            msg.extend(seq.to_ne_bytes());
            msg.extend(0u32.to_ne_bytes());
            // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
            msg.extend([
                libc::AF_INET as u8,
                32,
                0,
                0,
                RT_TABLE_MAIN,
                protocol,
                scope,
                RTN_BLACKHOLE,
            ]);
            msg.extend(0u32.to_ne_bytes());
            // struct rtattr RTA_DST and the address.
            msg.extend(8u16.to_ne_bytes());
            msg.extend(RTA_DST.to_ne_bytes());
            msg.extend(to.octets());
            // SAFETY: a zeroed sockaddr_nl is valid (the kernel as the peer).
            let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            // SAFETY: `msg` and `kernel` are valid for the lengths given.
            let sent = unsafe {
                libc::sendto(
                    self.0.as_raw_fd(),
                    msg.as_ptr().cast(),
                    msg.len(),
                    0,
                    (&kernel as *const libc::sockaddr_nl).cast(),
                    std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut buf = [0u8; 4096];
            loop {
                // SAFETY: `buf` is valid for its length.
                let got = unsafe {
                    libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0)
                };
                if got < 0 {
                    return Err(io::Error::last_os_error());
                }
                let got = got as usize;
                let mut at = 0;
                // Each message: nlmsghdr (16 bytes), then its payload; an ack is NLMSG_ERROR
                // with the error (0: done) and our request's header.
                while at + 20 <= got {
                    let word = |i: usize| u32::from_ne_bytes(buf[i..i + 4].try_into().unwrap());
                    let len = word(at) as usize;
                    let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().unwrap());
                    if kind == NLMSG_ERROR && word(at + 8) == seq {
                        let error = i32::from_ne_bytes(buf[at + 16..at + 20].try_into().unwrap());
                        return match error {
                            0 => Ok(()),
                            e => Err(io::Error::from_raw_os_error(-e)),
                        };
                    }
                    if len < 16 {
                        break;
                    }
                    at += (len + 3) & !3;
                }
            }
        }
    }
}

/// Stand-ins elsewhere: [`unavailable`] says why no [`Net`] is made.
#[cfg(not(target_os = "linux"))]
mod linux {
    use std::io;
    use std::net::{Ipv4Addr, SocketAddr};

    use super::AnyResult;

    pub fn connect_from(_: &str, _: SocketAddr) -> io::Result<()> {
        Err(io::Error::other("network namespaces need Linux"))
    }

    pub struct RouteSocket;

    impl RouteSocket {
        pub fn open_in(_: &str) -> AnyResult<RouteSocket> {
            Err("network namespaces need Linux".into())
        }

        pub fn blackhole(&self, _: bool, _: Ipv4Addr) -> io::Result<()> {
            Err(io::Error::other("network namespaces need Linux"))
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = self.heal();
        for host in &self.hosts {
            kill_namespace_processes(&host.ns);
            let _ = ip(&["link", "del", &host.veth]);
            let _ = ip(&["netns", "del", &host.ns]);
        }
        if let Some(bridge) = &self.bridge {
            let _ = ip(&["link", "del", bridge]);
        }
    }
}
