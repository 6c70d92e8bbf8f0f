//! The raw system calls of the socket datapath that socket2 does not cover:
//! `sendmmsg` with `UDP_SEGMENT` control messages, `recvmmsg` with `UDP_GRO`
//! control messages and source addresses, `setsockopt` for the reuseport
//! steering program, `UDP_GRO` and the `UDP_SEGMENT` probe, and `getsockopt`
//! for a socket's drop count (`SO_MEMINFO`). All of the
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
/// `SO_MEMINFO` (asm-generic value; likewise not exported by `libc`).
#[cfg(not(any(target_arch = "sparc", target_arch = "sparc64")))]
const SO_MEMINFO: libc::c_int = 55;
#[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
const SO_MEMINFO: libc::c_int = 0x39;
/// Entries of `SO_MEMINFO`'s answer (`SK_MEMINFO_VARS`).
const SK_MEMINFO_VARS: usize = 9;

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

/// Datagrams the kernel dropped on `fd` (`SO_MEMINFO`'s `SK_MEMINFO_DROPS`,
/// the counter /proc/net/udp prints in its last column: a full receive
/// buffer, mostly). One system call on the socket itself, whatever else the
/// namespace holds. Fails on a kernel without `SO_MEMINFO` (before 4.6) or
/// one whose answer stops before the drop count.
#[allow(unsafe_code)]
pub(super) fn socket_drops(fd: BorrowedFd<'_>) -> io::Result<u32> {
    const DROPS: usize = libc::SK_MEMINFO_DROPS as usize;
    let mut mem = [0u32; SK_MEMINFO_VARS];
    let mut len = mem::size_of_val(&mem) as libc::socklen_t;
    // SAFETY: `mem` is a live, writable array of `len` bytes for the whole
    // call, `len` is a live `socklen_t` the kernel updates with the bytes it
    // wrote (at most the `len` given); `fd` is open.
    let rc = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, SO_MEMINFO, mem.as_mut_ptr().cast(), &mut len)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if (len as usize) < (DROPS + 1) * mem::size_of::<u32>() {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "SO_MEMINFO without SK_MEMINFO_DROPS"));
    }
    Ok(mem[DROPS])
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

/// The receive side's buffers and the `recvmmsg` arrays that describe them,
/// built once: a receive call only resets the lengths the kernel wrote back
/// (a call used to allocate and zero four arrays, ~8 KiB at a batch of 32,
/// and the daemon makes one call per ~15 datagrams).
pub(super) struct RxBatch {
    /// `n` slots of `slot` bytes, one datagram (or GRO train) each.
    buf: Vec<u8>,
    slot: usize,
    meta: Vec<RxMeta>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    controls: Vec<RxControl>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point into this value's own
// heap arrays (`buf`, `iovs`, `names`, `controls`), which are never resized
// after `new`; they are only handed to the kernel by `recv`, which holds
// `&mut self`. Moving the value to another thread moves the arrays with it
// (their heap addresses do not change) and shares nothing.
#[allow(unsafe_code)]
unsafe impl Send for RxBatch {}

impl std::fmt::Debug for RxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxBatch").field("slots", &self.meta.len()).field("slot", &self.slot).finish()
    }
}

impl RxBatch {
    /// Room for `n` datagrams of up to `slot` bytes per receive call.
    #[allow(unsafe_code)]
    pub(super) fn new(n: usize, slot: usize) -> RxBatch {
        let mut buf = vec![0u8; n * slot];
        let mut iovs: Vec<libc::iovec> = buf
            .chunks_exact_mut(slot)
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
            .collect();
        // SAFETY: all-zero bytes are a valid `sockaddr_storage`.
        let mut names: Vec<libc::sockaddr_storage> = vec![unsafe { mem::zeroed() }; n];
        let mut controls = vec![RxControl([0; 64]); n];
        let (iov_base, name_base, control_base) =
            (iovs.as_mut_ptr(), names.as_mut_ptr(), controls.as_mut_ptr());
        let hdrs = (0..n)
            .map(|i| {
                // SAFETY: all-zero bytes are a valid `mmsghdr`.
                let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
                h.msg_hdr.msg_name = name_base.wrapping_add(i).cast();
                h.msg_hdr.msg_iov = iov_base.wrapping_add(i);
                h.msg_hdr.msg_iovlen = 1;
                h.msg_hdr.msg_control = control_base.wrapping_add(i).cast();
                h
            })
            .collect();
        RxBatch { buf, slot, meta: vec![RxMeta::default(); n], iovs, names, controls, hdrs }
    }

    /// One `recvmmsg` on `fd` into the slots; returns how many datagrams
    /// arrived, described by `meta()[..n]` and read with [`RxBatch::datagram`].
    #[allow(unsafe_code)]
    pub(super) fn recv(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        let n = self.hdrs.len();
        // The kernel wrote back the name and control lengths and the flags of
        // the messages of the last call: give every header its room again.
        for h in &mut self.hdrs {
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = mem::size_of::<RxControl>() as _;
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: header `i`'s name, iovec and control point to `names[i]`,
        // `iovs[i]` (whose buffer is the distinct slot `i` of `buf`) and
        // `controls[i]`, set in `new` and valid since: none of these arrays is
        // resized after it, and `&mut self` borrows them all exclusively for
        // the call. The kernel writes at most `msg_namelen` bytes of name,
        // `slot` bytes of data and `msg_controllen` bytes of control per
        // message.
        let rc = unsafe {
            libc::recvmmsg(fd.as_raw_fd(), self.hdrs.as_mut_ptr(), n as libc::c_uint, 0, std::ptr::null_mut())
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = rc as usize;
        for (i, h) in self.hdrs[..got].iter().enumerate() {
            self.meta[i] = RxMeta {
                len: (h.msg_len as usize).min(self.slot),
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                src: parse_name(&self.names[i], h.msg_hdr.msg_namelen),
                segment: gro_segment(&h.msg_hdr),
            };
        }
        // The arrays the headers point into are only ever read by the kernel.
        debug_assert!(self.iovs.len() == n && self.controls.len() == n);
        Ok(got)
    }

    /// What the last call learned about each datagram it received.
    pub(super) fn meta(&self) -> &[RxMeta] {
        &self.meta
    }

    /// Datagrams per call.
    pub(super) fn slots(&self) -> usize {
        self.meta.len()
    }

    /// The bytes of datagram `i` of the last call (`meta()[i].len` of them).
    pub(super) fn datagram(&self, i: usize) -> &[u8] {
        &self.buf[i * self.slot..i * self.slot + self.meta[i].len]
    }
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

    /// The arrays built once serve call after call: each call reports its
    /// own datagrams' lengths, sources and truncation, not the last call's.
    #[test]
    fn a_receive_batch_is_reused_across_calls() {
        use std::net::UdpSocket;
        use std::os::fd::AsFd;
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let (a, b) = (UdpSocket::bind("127.0.0.1:0").unwrap(), UdpSocket::bind("127.0.0.1:0").unwrap());
        let to = rx.local_addr().unwrap();
        let mut batch = RxBatch::new(4, 64);
        let wait = |batch: &mut RxBatch, want: usize| {
            for _ in 0..200 {
                match batch.recv(rx.as_fd()) {
                    Ok(n) if n >= want => return n,
                    Ok(n) => panic!("{n} datagrams, wanted {want}"),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(5))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            panic!("nothing arrived")
        };
        a.send_to(&[1; 40], to).unwrap();
        b.send_to(&[2; 100], to).unwrap(); // longer than a slot: cut short
        let mut got = 0;
        while got < 2 {
            let n = wait(&mut batch, 1);
            for i in 0..n {
                let m = batch.meta()[i];
                if m.src == Some(a.local_addr().unwrap()) {
                    assert_eq!((m.len, m.truncated, batch.datagram(i)), (40, false, &[1u8; 40][..]));
                } else {
                    assert_eq!(m.src, Some(b.local_addr().unwrap()));
                    assert_eq!((m.len, m.truncated, batch.datagram(i)), (64, true, &[2u8; 64][..]));
                }
            }
            got += n;
        }
        b.send_to(&[3; 7], to).unwrap();
        assert_eq!(wait(&mut batch, 1), 1);
        let m = batch.meta()[0];
        assert_eq!(
            (m.src, m.len, m.truncated, batch.datagram(0)),
            (Some(b.local_addr().unwrap()), 7, false, &[3u8; 7][..])
        );
        // With UDP_GRO on, a plain datagram leaves the kernel's control
        // length at 0; the next call must still read a GSO train's segment
        // size (loopback hands the train over whole).
        if probe_gso(Domain::IPV4) && enable_gro(rx.as_fd()).is_ok() {
            a.send_to(&[4; 9], to).unwrap();
            assert_eq!(wait(&mut batch, 1), 1);
            assert_eq!((batch.meta()[0].len, batch.meta()[0].segment), (9, 0));
            let dst = SockAddr::from(to);
            let parts: [&[u8]; 1] = [&[5; 60]];
            assert_eq!(send_batch(b.as_fd(), &[TxMsg { dst: &dst, parts: &parts, segment: 20 }]).unwrap(), 1);
            assert_eq!(wait(&mut batch, 1), 1);
            let m = batch.meta()[0];
            assert_eq!((m.len, m.segment, m.truncated), (60, 20, false));
        }
        assert_eq!(batch.recv(rx.as_fd()).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn gso_refusal_errnos() {
        for e in [libc::EINVAL, libc::EIO, libc::ENOPROTOOPT, libc::EOPNOTSUPP, libc::EMSGSIZE] {
            assert!(is_gso_refusal(&io::Error::from_raw_os_error(e)));
        }
        assert!(!is_gso_refusal(&io::Error::from_raw_os_error(libc::EHOSTUNREACH)));
        assert!(!is_gso_refusal(&io::Error::from(io::ErrorKind::WouldBlock)));
    }
}
