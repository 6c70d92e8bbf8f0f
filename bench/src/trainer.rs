//! One trainer of the allreduce benchmark (see `main.rs`): the Rust client
//! (`dlcp-client`), timed from submit to completion, input rewritten before
//! every rep (outside the timing) so values stay bounded.

use std::time::{Duration, Instant};

use dlcp_client::{Client, Options, TensorId};

/// Deterministic small values (|x| < 1e-2), so sums over reps cannot overflow.
pub(crate) fn input(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
        })
        .collect()
}

fn list(args: &[String], name: &str) -> Result<Option<Vec<usize>>, String> {
    let Some(v) = crate::flag::<String>(args, name)? else { return Ok(None) };
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("{name}: bad element count '{s}'")))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Seconds as a JSON array.
pub(crate) fn secs(v: &[f64]) -> String {
    let s: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
    format!("[{}]", s.join(","))
}

pub fn main(args: &[String]) -> Result<(), String> {
    let socket: String = crate::flag(args, "--socket")?.ok_or("--socket is required")?;
    let job: u64 = crate::flag(args, "--job")?.unwrap_or(7);
    let reps: usize = crate::flag(args, "--reps")?.unwrap_or(5);
    let warmup: usize = crate::flag(args, "--warmup")?.unwrap_or(1);
    let budget: u32 = crate::flag(args, "--budget-ppm")?.unwrap_or(0);
    let timeout = Duration::from_secs(crate::flag(args, "--timeout-s")?.unwrap_or(120));
    let seed: u64 = crate::flag(args, "--seed")?.unwrap_or(1);
    let sizes = list(args, "--sizes")?;
    let buckets = list(args, "--buckets")?;
    let mut cl = Client::attach(&socket, job, 0, 1).map_err(|e| format!("attach to {socket}: {e}"))?;
    // Inputs are made before the timed region's CPU marks (peer.py does the same).
    let inputs: Vec<Vec<f32>> = match (&sizes, &buckets) {
        (Some(s), _) => s.iter().enumerate().map(|(i, &n)| input(seed + i as u64, n)).collect(),
        (None, Some(b)) => b.iter().enumerate().map(|(i, &n)| input(seed + i as u64, n)).collect(),
        (None, None) => return Err("one of --sizes or --buckets is required".into()),
    };
    let cpu0 = crate::cpu_seconds();
    let m0 = crate::window::start();
    let mut min_delivered = 1_000_000u32;
    let mut repairs = 0u64;
    let mut results = Vec::new();
    let mut check = |r: Result<dlcp_client::Report, dlcp_client::Error>| -> Result<(), String> {
        let r = r.map_err(|e| format!("allreduce failed: {e}"))?;
        min_delivered = min_delivered.min(r.delivered_ppm);
        repairs += u64::from(r.repairs);
        Ok(())
    };
    if let Some(sizes) = sizes {
        for (i, &n) in sizes.iter().enumerate() {
            let id = cl.alloc(&format!("s{i}"), n as u64).map_err(|e| format!("alloc {n}: {e}"))?;
            let data = &inputs[i];
            let mut times = Vec::new();
            for rep in 0..warmup + reps {
                cl.write(id, data).map_err(|e| e.to_string())?;
                let t0 = Instant::now();
                check(cl.allreduce(id, Options::layer(0, 1).budget_ppm(budget), timeout))?;
                if rep >= warmup {
                    times.push(t0.elapsed().as_secs_f64());
                }
            }
            cl.free(id).map_err(|e| e.to_string())?;
            results.push(format!("{{\"elems\":{n},\"times\":{}}}", secs(&times)));
        }
    } else if let Some(b) = buckets {
        // Bucket 0 holds the front layers; submitted back to front, as a backward pass
        // hands them over, all at once (as if backward took no time).
        let layers = b.len() as u32;
        let ids: Vec<TensorId> = b
            .iter()
            .enumerate()
            .map(|(i, &n)| cl.alloc(&format!("b{i}"), n as u64).map_err(|e| format!("alloc {n}: {e}")))
            .collect::<Result<_, _>>()?;
        let (mut times, mut front) = (Vec::new(), Vec::new());
        for rep in 0..warmup + reps {
            for (id, d) in ids.iter().zip(&inputs) {
                cl.write(*id, d).map_err(|e| e.to_string())?;
            }
            let t0 = Instant::now();
            let mut seqs = Vec::new();
            for i in (0..b.len()).rev() {
                let o = Options::layer(i as u32, layers).budget_ppm(budget);
                seqs.push((i, cl.submit(ids[i], o).map_err(|e| format!("submit: {e}"))?));
            }
            let mut front_t = 0.0;
            let mut left = seqs.len();
            while left > 0 {
                let c = cl.wait(timeout).map_err(|e| format!("wait: {e}"))?;
                let (i, _) = *seqs.iter().find(|(_, s)| *s == c.op_seq).ok_or("unexpected completion")?;
                check(dlcp_client::report(ids[i], c))?;
                if i == 0 {
                    front_t = t0.elapsed().as_secs_f64();
                }
                left -= 1;
            }
            if rep >= warmup {
                times.push(t0.elapsed().as_secs_f64());
                front.push(front_t);
            }
        }
        let total: usize = b.iter().sum();
        results.push(format!("{{\"elems\":{total},\"times\":{},\"front\":{}}}", secs(&times), secs(&front)));
    } else {
        return Err("one of --sizes or --buckets is required".into());
    }
    let m1 = crate::window::end();
    let cpu = crate::cpu_seconds() - cpu0;
    println!(
        "{{\"system\":\"dlcp\",\"budget_ppm\":{budget},\"cpu_s\":{cpu:.3},\"min_delivered_ppm\":{min_delivered},\"repairs\":{repairs},\"window\":{},\"results\":[{}]}}",
        crate::window::json(&m0, &m1),
        results.join(",")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_small_deterministic_and_not_constant() {
        let a = input(3, 10_000);
        assert_eq!(a, input(3, 10_000));
        assert_ne!(a, input(4, 10_000));
        assert!(a.iter().all(|x| x.abs() <= 0.01), "values must stay small so repeated sums cannot overflow");
        assert!(a.iter().any(|x| *x > 0.0) && a.iter().any(|x| *x < 0.0));
    }

    #[test]
    fn element_lists_parse_and_reject_garbage() {
        let a: Vec<String> = ["--sizes", "1,2,,3"].iter().map(|s| s.to_string()).collect();
        assert_eq!(list(&a, "--sizes").unwrap(), Some(vec![1, 2, 3]));
        assert_eq!(list(&a, "--buckets").unwrap(), None);
        let b: Vec<String> = ["--sizes", "1,x"].iter().map(|s| s.to_string()).collect();
        assert!(list(&b, "--sizes").is_err());
    }
}
