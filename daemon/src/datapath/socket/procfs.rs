//! The drop counts of the datapath's sockets where the kernel has no
//! `SO_MEMINFO` (before Linux 4.6; otherwise `sys::socket_drops` asks each
//! socket): drops for a full receive buffer (`RcvbufErrors`, per socket).
//! /proc/net/udp and /proc/net/udp6 list every UDP socket of the network
//! namespace with its inode and, in the last column, the datagrams the kernel
//! dropped on it; the datapath knows its sockets' inodes.

use std::os::fd::BorrowedFd;

/// The inode of a socket (as /proc/net/udp lists it), if `fstat` works.
pub(super) fn inode(fd: BorrowedFd<'_>) -> Option<u64> {
    rustix::fs::fstat(fd).ok().map(|st| st.st_ino)
}

/// Datagrams the kernel dropped on the sockets with these inodes, summed
/// over /proc/net/udp and /proc/net/udp6 (a file that cannot be read counts
/// nothing).
pub(super) fn drops(inodes: &[u64]) -> u64 {
    ["/proc/net/udp", "/proc/net/udp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|t| drops_in(&t, inodes))
        .sum()
}

/// [`drops`] over one file's text: the header line, then one line per
/// socket whose 10th column is the inode and whose last is the drop count.
fn drops_in(text: &str, inodes: &[u64]) -> u64 {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let inode: u64 = cols.get(9)?.parse().ok()?;
            let drops: u64 = cols.last()?.parse().ok()?;
            inodes.contains(&inode).then_some(drops)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  291: 0100007F:1E15 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 48217 2 0000000000000000 17
  292: 0100007F:1E16 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 48218 2 0000000000000000 0
  305: 0100007F:1E23 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 48299 2 0000000000000000 5
";

    #[test]
    fn sums_the_drops_of_the_given_sockets_only() {
        assert_eq!(drops_in(SAMPLE, &[48217, 48218]), 17);
        assert_eq!(drops_in(SAMPLE, &[48217, 48299]), 22);
        assert_eq!(drops_in(SAMPLE, &[1]), 0);
        assert_eq!(drops_in("header only\n", &[48217]), 0);
        assert_eq!(drops_in("h\n garbage line\n", &[48217]), 0);
    }

    #[test]
    fn a_real_socket_is_listed_with_its_inode() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let ino = inode(std::os::fd::AsFd::as_fd(&s)).unwrap();
        let listed = std::fs::read_to_string("/proc/net/udp").unwrap();
        assert!(listed.lines().any(|l| l.split_whitespace().nth(9) == Some(&ino.to_string())), "{listed}");
        assert_eq!(drops(&[ino]), 0);
    }

    /// The datapath's two sources of a socket's drop count agree: a
    /// loopback socket with a small receive buffer overflows, and
    /// `SO_MEMINFO` gives what /proc/net/udp lists (fails if either reads
    /// another counter, or nothing).
    #[test]
    fn so_meminfo_counts_what_proc_lists() {
        use std::os::fd::AsFd;
        let rx = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        rx.set_recv_buffer_size(4096).unwrap();
        rx.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        let to = rx.local_addr().unwrap().as_socket().unwrap();
        assert_eq!(super::super::sys::socket_drops(rx.as_fd()).unwrap(), 0);
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..200 {
            tx.send_to(&[7u8; 1000], to).unwrap();
        }
        let meminfo = super::super::sys::socket_drops(rx.as_fd()).unwrap();
        let listed = drops(&[inode(rx.as_fd()).unwrap()]);
        assert!(meminfo > 100, "a 4 KiB receive buffer kept {} of 200 datagrams", 200 - meminfo);
        assert_eq!(u64::from(meminfo), listed);
    }
}
