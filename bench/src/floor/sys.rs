//! The system calls of the floor datapath that std does not cover: socket
//! options, `sendmmsg` with a `UDP_SEGMENT` control message per message,
//! `recvmmsg` with `UDP_GRO`, and `poll`. Each function is safe to call: the
//! pointers handed to the kernel are built inside from live references.

use std::io;
use std::mem;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, BorrowedFd};

/// One segment of an outgoing message: a header and the tensor elements it
/// carries (sent as two iovecs, no user-space copy of the payload).
pub struct Segment<'a> {
    /// The floor header of this datagram.
    pub header: &'a [u8],
    /// The payload, in the host's byte order (both ends run on one machine).
    pub payload: &'a [f32],
}

/// One outgoing message: `segments` to `dst`, as one GSO super-packet of
/// `segment_size` bytes per datagram when there are several.
pub struct TxMsg<'a> {
    /// Destination.
    pub dst: &'a libc::sockaddr_in,
    /// The datagrams, back to back.
    pub segments: &'a [Segment<'a>],
    /// Bytes per datagram (header + full payload); the last may be shorter.
    pub segment_size: u16,
}

/// What one received buffer holds.
#[derive(Debug, Clone, Copy, Default)]
pub struct RxMeta {
    /// Bytes received.
    pub len: usize,
    /// The `UDP_GRO` segment size (0: one datagram).
    pub segment: usize,
    /// The datagram did not fit the buffer.
    pub truncated: bool,
}

/// `setsockopt(fd, level, name, value)` of an `int`.
fn set_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` lives on this stack frame for the whole call and is
    // `size_of::<c_int>()` bytes; the kernel only reads it; `fd` is open.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// `getsockopt(fd, level, name)` of an `int`.
fn get_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` live for the whole call; the kernel writes at most
    // `len` (= size of `v`) bytes into `v` and the written length into `len`.
    let rc = unsafe {
        libc::getsockopt(fd.as_raw_fd(), level, name, (&mut v as *mut libc::c_int).cast(), &mut len)
    };
    if rc == 0 { Ok(v) } else { Err(io::Error::last_os_error()) }
}

/// A buffer size option: the `FORCE` variant first (root may exceed
/// `net.core.{r,w}mem_max`), then the plain one.
fn set_buffer(fd: BorrowedFd<'_>, force: libc::c_int, plain: libc::c_int, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes / 2).unwrap_or(libc::c_int::MAX); // the kernel doubles it
    set_int(fd, libc::SOL_SOCKET, force, v).or_else(|_| set_int(fd, libc::SOL_SOCKET, plain, v))
}

/// The settings of a floor socket as the kernel took them.
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    /// `SO_RCVBUF` as the kernel reports it (bytes, doubled by the kernel).
    pub rcvbuf: usize,
    /// `SO_SNDBUF` as the kernel reports it.
    pub sndbuf: usize,
}

/// A non-blocking UDP socket bound to `addr`, with `UDP_GRO` on, the given
/// buffer sizes and DSCP.
pub fn open(addr: SocketAddrV4, rcvbuf: usize, sndbuf: usize, dscp: u8) -> io::Result<(UdpSocket, Opened)> {
    let s = UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    let fd = std::os::fd::AsFd::as_fd(&s);
    set_buffer(fd, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, rcvbuf)?;
    set_buffer(fd, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, sndbuf)?;
    set_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1)?;
    set_int(fd, libc::IPPROTO_IP, libc::IP_TOS, libc::c_int::from(dscp) << 2)?;
    let opened = Opened {
        rcvbuf: get_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)? as usize,
        sndbuf: get_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)? as usize,
    };
    Ok((s, opened))
}

/// `addr` as a `sockaddr_in`.
pub fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*addr.ip()).to_be() },
        sin_zero: [0; 8],
    }
}

/// Room for one `cmsghdr` carrying a `u16` or an `int`, aligned for it.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Control([u8; 32]);

/// One `sendmmsg` of `msgs` (`MSG_DONTWAIT`); returns how many messages the
/// kernel took (an error only if it took none).
pub fn send_batch(fd: BorrowedFd<'_>, msgs: &[TxMsg<'_>]) -> io::Result<usize> {
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(msgs.iter().map(|m| 2 * m.segments.len()).sum());
    for m in msgs {
        for s in m.segments {
            iovs.push(libc::iovec { iov_base: s.header.as_ptr().cast_mut().cast(), iov_len: s.header.len() });
            iovs.push(libc::iovec {
                iov_base: s.payload.as_ptr().cast_mut().cast(),
                iov_len: mem::size_of_val(s.payload),
            });
        }
    }
    let mut controls = vec![Control([0; 32]); msgs.len()];
    let iov_base = iovs.as_mut_ptr();
    let control_base = controls.as_mut_ptr();
    let mut hdrs: Vec<libc::mmsghdr> = Vec::with_capacity(msgs.len());
    let mut first_iov = 0;
    for (i, m) in msgs.iter().enumerate() {
        // SAFETY: all-zero bytes are a valid `mmsghdr` (null pointers, zero lengths).
        let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
        h.msg_hdr.msg_name = (m.dst as *const libc::sockaddr_in).cast_mut().cast();
        h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        h.msg_hdr.msg_iov = iov_base.wrapping_add(first_iov);
        h.msg_hdr.msg_iovlen = (2 * m.segments.len()) as _;
        first_iov += 2 * m.segments.len();
        if m.segments.len() > 1 {
            let control = control_base.wrapping_add(i);
            h.msg_hdr.msg_control = control.cast();
            // SAFETY: CMSG_SPACE only computes a size.
            h.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
            // SAFETY: `msg_control` points to `controls[i]`, a live, zeroed,
            // 8-aligned buffer of 32 bytes ≥ `msg_controllen`, so CMSG_FIRSTHDR
            // returns its start and CMSG_DATA points 2 writable bytes inside it
            // (written unaligned).
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                (*cmsg).cmsg_level = libc::SOL_UDP;
                (*cmsg).cmsg_type = libc::UDP_SEGMENT;
                (*cmsg).cmsg_len = libc::CMSG_LEN(2) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), m.segment_size);
            }
        }
        hdrs.push(h);
    }
    // SAFETY: `hdrs` holds `msgs.len()` initialised headers whose name, iovec and
    // control pointers point into `msgs` (borrowed for this call: headers,
    // payload slices and addresses), `iovs` and `controls` (alive until the end
    // of this function, not moved after the pointers were taken); the kernel
    // only reads them and writes each `msg_len` inside `hdrs`.
    let rc = unsafe {
        libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), hdrs.len() as libc::c_uint, libc::MSG_DONTWAIT)
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc as usize) }
}

/// The segment size of a `UDP_GRO` control message in `msg`, or 0.
fn gro_segment(msg: &libc::msghdr) -> usize {
    let mut segment = 0;
    // SAFETY: `msg` was just filled by recvmmsg: `msg_control` points to a live
    // `Control` and `msg_controllen` is what the kernel wrote into it (at most
    // its size), so CMSG_FIRSTHDR/CMSG_NXTHDR stay inside it and return null at
    // its end; the data of a UDP_GRO message is an `int` (read unaligned).
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

/// One `recvmmsg` (`MSG_DONTWAIT`) into `bufs` cut in slots of `slot` bytes,
/// as many messages as `meta` has entries; fills `meta` and returns how many
/// messages arrived (`WouldBlock` when none).
pub fn recv_batch(
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
    let mut controls = vec![Control([0; 32]); n];
    let iov_base = iovs.as_mut_ptr();
    let control_base = controls.as_mut_ptr();
    let mut hdrs: Vec<libc::mmsghdr> = (0..n)
        .map(|i| {
            // SAFETY: all-zero bytes are a valid `mmsghdr`.
            let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
            h.msg_hdr.msg_iov = iov_base.wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = control_base.wrapping_add(i).cast();
            h.msg_hdr.msg_controllen = mem::size_of::<Control>() as _;
            h
        })
        .collect();
    // SAFETY: each header's iovec and control point to `iovs[i]` (whose buffer
    // is the distinct slot `i` of `bufs`, exclusively borrowed) and
    // `controls[i]`; all live until the end of this function and are not moved
    // after the pointers were taken. No name is asked for. The kernel writes at
    // most `slot` bytes of data and `msg_controllen` bytes of control per message.
    let rc = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = rc as usize;
    for (i, h) in hdrs[..got].iter().enumerate() {
        meta[i] = RxMeta {
            len: (h.msg_len as usize).min(slot),
            segment: gro_segment(&h.msg_hdr),
            truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
        };
    }
    Ok(got)
}

/// Waits until `fd` is readable (or writable, with `write`) or `timeout_ms` passed.
pub fn wait(fd: BorrowedFd<'_>, write: bool, timeout_ms: i32) -> io::Result<()> {
    let events = libc::POLLIN | if write { libc::POLLOUT } else { 0 };
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 };
    // SAFETY: `p` is one live `pollfd` for the whole call; the kernel writes
    // only its `revents`.
    let rc = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}
