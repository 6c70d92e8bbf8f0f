//! Opening the sockets of one port: the receive socket (bound first, with
//! the reuseport steering program) and the eight class sockets that join its
//! group, each marked with its class's DSCP and `SO_PRIORITY` (see the
//! [datapath's documentation](super)). The datapath opens one such set per
//! path, on consecutive ports.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use dlcp_proto::class::Class;
use log::{debug, warn};
use socket2::{Domain, Protocol, Socket, Type};

use super::config::{DatapathError, SocketConfig, SocketStats};
use super::sys;

/// The sockets of one port.
#[derive(Debug)]
pub(super) struct PortSockets {
    /// The receive socket.
    pub rx: Socket,
    /// The send socket of each class (index = class).
    pub tx: Vec<Socket>,
    /// The address they are bound to (the port resolved).
    pub local: SocketAddr,
    /// Incoming datagrams are steered to `rx` (else every socket is read).
    pub steered: bool,
}

/// Opens the receive and class sockets of `addr` under `cfg`'s settings;
/// `SO_PRIORITY` failures are counted in `extra`.
pub(super) fn bind_port(
    cfg: &SocketConfig,
    addr: SocketAddr,
    extra: &mut SocketStats,
) -> Result<PortSockets, DatapathError> {
    let domain = if addr.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
    let fail = |what: &str| {
        let what = what.to_string();
        move |source| DatapathError::Socket { addr, what, source }
    };
    let rx =
        Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).map_err(fail("create the receive socket"))?;
    rx.set_reuse_port(true).map_err(fail("set SO_REUSEPORT"))?;
    let steered = match sys::attach_steering(rx.as_fd()) {
        Ok(()) => true,
        Err(e) => {
            warn!("socket datapath {addr}: reuseport steering unavailable ({e}); reading every class socket");
            false
        }
    };
    rx.set_nonblocking(true).map_err(fail("make the receive socket non-blocking"))?;
    if cfg.recv_buffer_bytes > 0 {
        rx.set_recv_buffer_size(cfg.recv_buffer_bytes).map_err(fail("set SO_RCVBUF"))?;
    }
    rx.bind(&addr.into()).map_err(|source| DatapathError::Bind { addr, source })?;
    let local = rx
        .local_addr()
        .map_err(fail("read the bound address"))?
        .as_socket()
        .ok_or_else(|| fail("read the bound address")(io::Error::other("not an IP address")))?;
    let mut tx = Vec::with_capacity(Class::COUNT);
    for c in 0..Class::COUNT {
        let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))
            .map_err(fail(&format!("create the class {c} socket")))?;
        s.set_reuse_port(true).map_err(fail("set SO_REUSEPORT"))?;
        s.set_nonblocking(true).map_err(fail("make a class socket non-blocking"))?;
        if cfg.send_buffer_bytes > 0 {
            s.set_send_buffer_size(cfg.send_buffer_bytes).map_err(fail("set SO_SNDBUF"))?;
        }
        mark(&s, local, c, cfg.dscp[c]).map_err(fail(&format!("set the DSCP of class {c}")))?;
        // After the TOS: setting IP_TOS resets SO_PRIORITY.
        if let Err(e) = s.set_priority(cfg.so_priority[c]) {
            extra.so_priority_failures += 1;
            if extra.so_priority_failures == 1 {
                warn!(
                    "socket datapath {local}: cannot set SO_PRIORITY {} for class {c}: {e} \
                     (values above 6 need CAP_NET_ADMIN); further failures logged at debug",
                    cfg.so_priority[c]
                );
            } else {
                debug!("socket datapath {local}: SO_PRIORITY {} for class {c}: {e}", cfg.so_priority[c]);
            }
        }
        s.bind(&local.into()).map_err(|source| DatapathError::Bind { addr: local, source })?;
        tx.push(s);
    }
    Ok(PortSockets { rx, tx, local, steered })
}

/// Mark class `c`'s socket `s` (bound or to be bound to `local`) with `dscp`:
/// `IPV6_TCLASS`, and `IP_TOS` too on IPv6 (IPv4 destinations of a dual-stack
/// or v4-mapped socket leave with it); `IP_TOS` on IPv4.
pub(super) fn mark(s: &Socket, local: SocketAddr, c: usize, dscp: u8) -> io::Result<()> {
    let tos = u32::from(dscp) << 2;
    if local.is_ipv6() {
        s.set_tclass_v6(tos)?;
        if let Err(e) = s.set_tos_v4(tos) {
            debug!("socket datapath {local}: IP_TOS on an IPv6 socket (class {c}): {e}");
        }
        Ok(())
    } else {
        s.set_tos_v4(tos)
    }
}
