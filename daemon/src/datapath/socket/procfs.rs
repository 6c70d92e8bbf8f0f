//! What the kernel counts about the datapath's sockets and the socket API
//! does not return: drops for a full receive buffer (`RcvbufErrors`, per
//! socket). /proc/net/udp and /proc/net/udp6 list every UDP socket of the
//! network namespace with its inode and, in the last column, the datagrams
//! the kernel dropped on it; the datapath knows its sockets' inodes.

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
}
