//! CPU marks at the start and end of a rank's timed region, for the harness's
//! CPU-per-GiB figures (see `bench/README.md`).
//!
//! Each rank prints a `"window"` object: wall-clock time (seconds since the
//! epoch, comparable across processes), the `usage_usec` of the cgroup v2
//! group the harness put the whole system in (daemons and trainers; the
//! harness names the group's `cpu.stat` in `DLCP_BENCH_CGROUP_CPU_STAT`, a
//! path that stays readable inside a network namespace), and the machine's
//! busy and total jiffies from `/proc/stat`. The harness takes the earliest
//! start and the latest end over the ranks: the counters are cumulative, so
//! their difference is the CPU spent in that interval.

use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable naming the system's cgroup `cpu.stat`.
pub const CGROUP_ENV: &str = "DLCP_BENCH_CGROUP_CPU_STAT";
/// The environment variable naming a file to create when the timed region
/// starts (the harness starts `perf record` then; `<file>.end` when it ends).
pub const STARTED_ENV: &str = "DLCP_BENCH_STARTED";

/// CPU counters at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mark {
    /// Seconds since the Unix epoch.
    pub wall: f64,
    /// The system cgroup's `usage_usec` (None: no group, or unreadable).
    pub cgroup_usec: Option<u64>,
    /// Machine-wide busy jiffies (user + nice + system + irq + softirq + steal).
    pub busy: Option<u64>,
    /// Machine-wide jiffies of every kind (busy + idle + iowait).
    pub total: Option<u64>,
}

/// `usage_usec` from the text of a cgroup v2 `cpu.stat`.
pub fn parse_cpu_stat(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("usage_usec ")).and_then(|v| v.trim().parse().ok())
}

/// (busy, total) jiffies from the text of `/proc/stat` (its aggregate `cpu` line).
pub fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some((busy, busy + at(3) + at(4)))
}

/// Reads the counters now.
pub fn mark() -> Mark {
    let cgroup_usec = std::env::var(CGROUP_ENV)
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| parse_cpu_stat(&t));
    let machine = std::fs::read_to_string("/proc/stat").ok().and_then(|t| parse_proc_stat(&t));
    let wall = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    Mark { wall, cgroup_usec, busy: machine.map(|m| m.0), total: machine.map(|m| m.1) }
}

/// Reads the counters at the start of the timed region, and creates the
/// file named by [`STARTED_ENV`] (if set) to say the region has started.
pub fn start() -> Mark {
    let m = mark();
    if let Ok(p) = std::env::var(STARTED_ENV) {
        let _ = std::fs::write(p, b"");
    }
    m
}

/// Reads the counters at the end of the timed region, and creates the file
/// named by [`STARTED_ENV`] with `.end` appended (if set).
pub fn end() -> Mark {
    let m = mark();
    if let Ok(p) = std::env::var(STARTED_ENV) {
        let _ = std::fs::write(p + ".end", b"");
    }
    m
}

/// The `"window"` JSON object of a timed region from `a` to `b`.
pub fn json(a: &Mark, b: &Mark) -> String {
    let opt = |v: Option<u64>| v.map_or("null".to_string(), |x| x.to_string());
    format!(
        "{{\"t0\":{:.6},\"t1\":{:.6},\"cg0\":{},\"cg1\":{},\"busy0\":{},\"busy1\":{},\"total0\":{},\"total1\":{}}}",
        a.wall,
        b.wall,
        opt(a.cgroup_usec),
        opt(b.cgroup_usec),
        opt(a.busy),
        opt(b.busy),
        opt(a.total),
        opt(b.total)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cgroup_cpu_stat_and_proc_stat() {
        let cg = "usage_usec 1149532708\nuser_usec 961393054\nsystem_usec 188139653\n";
        assert_eq!(parse_cpu_stat(cg), Some(1_149_532_708));
        assert_eq!(parse_cpu_stat("user_usec 5\n"), None);
        let ps = "cpu  10 1 20 300 4 5 6 7 0 0\ncpu0 5 0 10 150 2 2 3 3 0 0\nintr 1\n";
        assert_eq!(parse_proc_stat(ps), Some((10 + 1 + 20 + 5 + 6 + 7, 49 + 300 + 4)));
        assert_eq!(parse_proc_stat("intr 1\n"), None);
    }

    #[test]
    fn marks_advance_and_print_as_json() {
        let a = mark();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let b = mark();
        assert!(b.wall > a.wall && a.total.is_some(), "{a:?} {b:?}");
        assert!(b.total >= a.total);
        let j = json(&a, &b);
        assert!(j.starts_with("{\"t0\":") && j.contains("\"busy1\":") && j.ends_with('}'), "{j}");
        let none = Mark { wall: 1.0, cgroup_usec: None, busy: None, total: None };
        assert!(json(&none, &none).contains("\"cg0\":null"));
    }
}
