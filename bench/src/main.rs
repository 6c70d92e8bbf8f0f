//! `dlcp-bench`: the Rust half of `bench/run.sh`.
//!
//! * `dlcp-bench micro [--ms N]` — micro benchmarks, each printed as a ratio to a
//!   limit measured in the same run on the same core:
//!   header encode/decode (packets/s) vs a kernel UDP send loop (packets/s);
//!   f32 sum aggregation (GB/s) vs `memcpy` of the same bytes;
//!   the shared-memory channel (descriptor round trips/s, and GB/s of tensor data
//!   trainer → daemon → trainer) vs `memcpy`.
//!   Prints one `NAME: dlcp X, peer Y, ratio R` line per benchmark, then `JSON {...}`.
//! * `dlcp-bench trainer --socket PATH ...` — one trainer of the allreduce
//!   benchmark: attaches to its host's `dlcpd` with the Rust client (`dlcp-client`),
//!   runs warm-up and timed allreduces, prints its per-rep times and CPU time as JSON.
//!   `bench/harness.py` starts one per testbed host.
//! * `dlcp-bench floor --rank R --peers IP:PORT,.. ...` — one host of the floor:
//!   the same allreduce bytes over bare `sendmmsg`/`recvmmsg` (GSO/GRO), summed,
//!   with no protocol, MAC or repair (see `floor/mod.rs`). One per testbed host.
//!
//! Trainers and the floor print a `"window"` of CPU counters (see `window.rs`).

mod floor;
mod micro;
mod trainer;
mod window;

use std::process::ExitCode;

fn usage() -> &'static str {
    "usage:
  dlcp-bench micro [--ms MILLIS] [--only endpoint_allreduce[_jumbo|_noauth]]
  dlcp-bench trainer --socket PATH [--job ID] (--sizes E1,E2,.. | --buckets E1,E2,..) [--reps N]
      [--warmup N] [--budget-ppm P] [--timeout-s S]
  dlcp-bench floor --rank R --peers IP:PORT,IP:PORT,.. --sizes E1,E2,.. [--mtu M] [--reps N]
      [--warmup N] [--seed S] [--gso-segments G] [--batch B] [--rcvbuf BYTES] [--sndbuf BYTES]
      [--dscp D] [--idle-ms MS] [--barrier-s S]
sizes and buckets are in f32 elements; buckets are listed front layer first."
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("micro") => micro::main(&args[1..]),
        Some("trainer") => trainer::main(&args[1..]),
        Some("floor") => floor::main(&args[1..]),
        Some("-h" | "--help") => {
            println!("{}", usage());
            return ExitCode::SUCCESS;
        }
        _ => Err(format!("unknown or missing command\n{}", usage())),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlcp-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Value of `--name` in `args`, parsed.
pub(crate) fn flag<T: std::str::FromStr>(args: &[String], name: &str) -> Result<Option<T>, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => {
            let v = args.get(i + 1).ok_or_else(|| format!("{name} needs a value"))?;
            v.parse().map(Some).map_err(|_| format!("{name}: bad value '{v}'"))
        }
    }
}

/// CPU seconds (user + system, all threads) this process has used so far.
pub(crate) fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // f[0] is field 3 (state): field k is f[k - 3]. USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_parses_present_absent_and_bad_values() {
        let a: Vec<String> = ["--reps", "7", "--x"].iter().map(|s| s.to_string()).collect();
        assert_eq!(flag::<u32>(&a, "--reps").unwrap(), Some(7));
        assert_eq!(flag::<u32>(&a, "--warmup").unwrap(), None);
        assert!(flag::<u32>(&a, "--x").is_err(), "a flag without a value is an error");
        let b: Vec<String> = ["--reps", "many"].iter().map(|s| s.to_string()).collect();
        assert!(flag::<u32>(&b, "--reps").is_err());
    }

    #[test]
    fn cpu_seconds_counts_this_process_work() {
        let t0 = cpu_seconds();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let used = cpu_seconds() - t0;
        // 300 ms of spinning; USER_HZ ticks are 10 ms and the machine may be shared.
        assert!(used > 0.02 && used < 5.0, "cpu_seconds advanced by {used}");
    }
}
