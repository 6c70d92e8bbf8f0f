//! The raw system calls of the socket datapath that socket2 does not cover:
//! `sendmmsg` with `UDP_SEGMENT` control messages, `recvmmsg` with `UDP_GRO`
//! control messages and source addresses, and `setsockopt` for the reuseport
//! steering program, `UDP_GRO` and the `UDP_SEGMENT` probe. All of the
//! datapath's `unsafe` is here, each block with its `SAFETY` argument. Each
//! function is safe to call: the pointers handed to the kernel are built
//! inside from live references.

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// What a receive call learned about one datagram.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RxMeta {
    /// Bytes received (at most the slot size).
    pub(super) len: usize,
    /// The kernel cut the datagram short (`MSG_TRUNC`).
    pub(super) truncated: bool,
    /// The source address, if the kernel gave an IP one.
    pub(super) src: Option<SocketAddr>,
    /// GRO segment size (0: one datagram).
    pub(super) segment: usize,
}

/// Errors with which a kernel refuses a GSO message it would send without GSO.
pub(super) fn is_gso_refusal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP | libc::EMSGSIZE)
    )
}

/// `SO_ATTACH_REUSEPORT_CBPF` (asm-generic value; not exported by `libc`
/// for this target).
#[cfg(not(any(target_arch = "sparc", target_arch = "sparc64")))]
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
#[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 0x35;

/// One outgoing message.
pub(super) struct TxMsg<'a> {
    /// Destination.
    pub dst: &'a SockAddr,
    /// Payload: these slices back to back, gathered by the kernel (several
    /// datagrams when `segment > 0`).
    pub parts: &'a [&'a [u8]],
    /// GSO segment size; 0 sends the payload as one datagram.
    pub segment: u16,
}

/// Room for one `cmsghdr` carrying a `u16` (`CMSG_SPACE(2)`), aligned for it.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct GsoControl([u8; 32]);

/// `setsockopt(fd, level, name, value)`.
#[allow(unsafe_code)]
fn setsockopt<T>(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live reference to `size_of::<T>()` readable bytes
    // for the whole call, and the kernel only reads them; `fd` is open.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Attaches `ret #0` as the reuseport program of `fd`'s group (created if
/// `fd` is not bound yet): every datagram goes to the group's first socket.
pub(super) fn attach_steering(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut program = [libc::sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k: 0 }];
    let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_mut_ptr() };
    setsockopt(fd, libc::SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &fprog)
}

/// Turns on `UDP_GRO` (coalesced receive with a segment-size cmsg).
pub(super) fn enable_gro(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt(fd, libc::SOL_UDP, libc::UDP_GRO, &(1 as libc::c_int))
}

/// Turns `UDP_GRO` off again.
pub(super) fn disable_gro(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt(fd, libc::SOL_UDP, libc::UDP_GRO, &(0 as libc::c_int))
}

/// True if the kernel accepts `UDP_SEGMENT` (tried on a throwaway socket).
pub(super) fn probe_gso(domain: Domain) -> bool {
    let Ok(s) = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)) else { return false };
    let size: libc::c_int = 1200;
    use std::os::fd::AsFd;
    setsockopt(s.as_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, &size).is_ok()
}

/// One `sendmmsg` of `msgs`; returns how many messages the kernel took.
#[allow(unsafe_code)]
pub(super) fn send_batch(fd: BorrowedFd<'_>, msgs: &[TxMsg<'_>]) -> io::Result<usize> {
    // Every message's parts, one iovec each (empty parts left out), message
    // after message; `first[i]` is where message `i`'s start.
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(msgs.len() * 3);
    let mut first = Vec::with_capacity(msgs.len() + 1);
    for m in msgs {
        first.push(iovs.len());
        for p in m.parts.iter().filter(|p| !p.is_empty()) {
            iovs.push(libc::iovec { iov_base: p.as_ptr().cast_mut().cast(), iov_len: p.len() });
        }
    }
    first.push(iovs.len());
    let mut controls = vec![GsoControl([0; 32]); msgs.len()];
    let iov_base = iovs.as_mut_ptr();
    let control_base = controls.as_mut_ptr();
    let mut hdrs: Vec<libc::mmsghdr> = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        // SAFETY: all-zero bytes are a valid `mmsghdr` (null pointers, zero lengths).
        let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
        h.msg_hdr.msg_name = m.dst.as_ptr().cast_mut().cast();
        h.msg_hdr.msg_namelen = m.dst.len();
        h.msg_hdr.msg_iov = iov_base.wrapping_add(first[i]);
        h.msg_hdr.msg_iovlen = (first[i + 1] - first[i]) as _;
        if m.segment > 0 {
            let control = control_base.wrapping_add(i);
            h.msg_hdr.msg_control = control.cast();
            // SAFETY: CMSG_SPACE only computes a size.
            h.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
            debug_assert!(h.msg_hdr.msg_controllen as usize <= mem::size_of::<GsoControl>());
            // SAFETY: `msg_control` points to `controls[i]`, a live, zeroed,
            // 8-aligned buffer of at least `msg_controllen` bytes, so
            // CMSG_FIRSTHDR returns a pointer to its start, and CMSG_DATA
            // points 2 bytes inside it (written unaligned).
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                (*cmsg).cmsg_level = libc::SOL_UDP;
                (*cmsg).cmsg_type = libc::UDP_SEGMENT;
                (*cmsg).cmsg_len = libc::CMSG_LEN(2) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), m.segment);
            }
        }
        hdrs.push(h);
    }
    // SAFETY: `hdrs` holds `msgs.len()` initialised headers whose name and
    // control pointers point into `msgs` and `controls`, and whose iovec
    // pointer and count cover message `i`'s own run `first[i]..first[i + 1]`
    // of `iovs` (each iovec a live slice borrowed through `msgs` for this
    // call); `iovs`, `controls` and `first` live until the end of this
    // function and are not moved after the pointers were taken. The kernel
    // only reads them and writes each `msg_len` inside `hdrs`.
    let rc = unsafe { libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), hdrs.len() as libc::c_uint, 0) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc as usize) }
}

/// One `recvmmsg` into `bufs` split in slots of `slot` bytes (as many
/// messages as `meta` has entries); fills `meta` for each message
/// received and returns how many.
#[allow(unsafe_code)]
pub(super) fn recv_batch(
    fd: BorrowedFd<'_>,
    bufs: &mut [u8],
    slot: usize,
    meta: &mut [RxMeta],
) -> io::Result<usize> {
    let n = meta.len().min(bufs.len() / slot);
    let mut iovs: Vec<libc::iovec> = bufs
        .chunks_exact_mut(slot)
        .take(n)
        .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
        .collect();
    // SAFETY: all-zero bytes are a valid `sockaddr_storage`.
    let mut names: Vec<libc::sockaddr_storage> = vec![unsafe { mem::zeroed() }; n];
    let mut controls = vec![RxControl([0; 64]); n];
    let iov_base = iovs.as_mut_ptr();
    let name_base = names.as_mut_ptr();
    let control_base = controls.as_mut_ptr();
    let mut hdrs: Vec<libc::mmsghdr> = (0..n)
        .map(|i| {
            // SAFETY: all-zero bytes are a valid `mmsghdr`.
            let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
            h.msg_hdr.msg_name = name_base.wrapping_add(i).cast();
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iov_base.wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = control_base.wrapping_add(i).cast();
            h.msg_hdr.msg_controllen = mem::size_of::<RxControl>() as _;
            h
        })
        .collect();
    // SAFETY: each header's name, iovec and control point to `names[i]`,
    // `iovs[i]` (whose buffer is the distinct slot `i` of `bufs`, exclusively
    // borrowed) and `controls[i]`; all live until the end of this function
    // and are not moved after the pointers were taken. The kernel writes at
    // most `msg_namelen` bytes of name, `slot` bytes of data and
    // `msg_controllen` bytes of control per message.
    let rc = unsafe {
        libc::recvmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), n as libc::c_uint, 0, std::ptr::null_mut())
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = rc as usize;
    for (i, h) in hdrs[..got].iter().enumerate() {
        meta[i] = RxMeta {
            len: (h.msg_len as usize).min(slot),
            truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            src: parse_name(&names[i], h.msg_hdr.msg_namelen),
            segment: gro_segment(&h.msg_hdr),
        };
    }
    Ok(got)
}

/// Room for the control messages of one received datagram (only `UDP_GRO`,
/// an `int`, is enabled), aligned for `cmsghdr`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct RxControl([u8; 64]);

/// The segment size of a `UDP_GRO` control message in `msg`, or 0.
#[allow(unsafe_code)]
fn gro_segment(msg: &libc::msghdr) -> usize {
    let mut segment = 0;
    // SAFETY: `msg` was just filled by recvmmsg: `msg_control` points to a
    // live `RxControl` and `msg_controllen` is what the kernel wrote into it
    // (at most its size), so CMSG_FIRSTHDR/CMSG_NXTHDR stay inside it and
    // return null at its end; the data of a UDP_GRO message is an `int`
    // (read unaligned).
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                segment = usize::try_from(v).unwrap_or(0);
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    segment
}

/// The IP address in a `sockaddr_storage` the kernel filled with `len` bytes.
#[allow(unsafe_code)]
fn parse_name(name: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(name.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the kernel wrote a `sockaddr_in` (family AF_INET, length
            // checked); `sockaddr_storage` is large and aligned enough for it.
            let a: libc::sockaddr_in =
                unsafe { std::ptr::read((name as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))),
                u16::from_be(a.sin_port),
            ))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for a `sockaddr_in6` (family AF_INET6).
            let a: libc::sockaddr_in6 =
                unsafe { std::ptr::read((name as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gso_refusal_errnos() {
        for e in [libc::EINVAL, libc::EIO, libc::ENOPROTOOPT, libc::EOPNOTSUPP, libc::EMSGSIZE] {
            assert!(is_gso_refusal(&io::Error::from_raw_os_error(e)));
        }
        assert!(!is_gso_refusal(&io::Error::from_raw_os_error(libc::EHOSTUNREACH)));
        assert!(!is_gso_refusal(&io::Error::from(io::ErrorKind::WouldBlock)));
    }
}
