//! `dlcpd`, the per-host dlcp daemon. See `dlcpd --help`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use dlcp::datapath::fault::FaultInjector;
use dlcp::demo::{self, DemoOptions};
use dlcp::simulate::{self, SimOptions};
use dlcp_proto::endpoint::{Collective, DType, ReduceOp};

#[derive(Parser)]
#[command(
    name = "dlcpd",
    version = dlcp::VERSION,
    about = "Per-host bounded-loss allreduce daemon for distributed DNN training",
    long_about = "dlcpd all-reduces gradient shards between training hosts over a custom UDP \
                  protocol with priority classes carried in DSCP, completing as soon as enough \
                  has arrived within a bounded loss budget.\n\n\
                  Run the node service with `dlcpd --config FILE`; see it work with `dlcpd demo` \
                  (real daemons on loopback) or `dlcpd simulate` (the protocol core on a simulated \
                  network); validate a file with `dlcpd check-config FILE`."
)]
struct Cli {
    /// Run as the node service with this configuration file (foreground; logs to
    /// stderr at `log.level`, or as `RUST_LOG` says).
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Testing aid: drop this percentage of received datagrams before the
    /// protocol sees them (seeded by rank), to exercise bounded loss without root.
    #[arg(long, value_name = "PCT", hide = true, default_value_t = 0.0)]
    debug_rx_loss: f64,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Start N daemons on loopback with K synthetic trainers each on shared memory, run allreduce rounds, print a table.
    Demo(LoopbackArgs),
    /// Run N hosts through the protocol core on the deterministic network simulator (virtual time), print a table.
    Simulate(DemoArgs),
    /// Validate a configuration file; print the effective configuration, or one `file:line:col: field: message` line.
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
}

#[derive(Args)]
struct LoopbackArgs {
    /// Number of daemons (hosts).
    #[arg(long, default_value_t = 4)]
    hosts: u32,
    /// Synthetic trainers per daemon (local ranks; their tensors are reduced locally first).
    #[arg(long, default_value_t = 2)]
    trainers_per_host: u32,
    /// Megabytes of f32 gradients per iteration, split over --layers tensors.
    #[arg(long, default_value_t = 8.0)]
    size: f64,
    /// Percentage of received datagrams each daemon drops (shows bounded loss without root).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Loss budget per transfer: a fraction (0.01) or a percentage ("1%"); 0 = reliable and
    /// bit-exact; at most 0.10.
    #[arg(long, default_value = "0.01", value_parser = budget_arg)]
    budget: f64,
    /// Allreduce iterations.
    #[arg(long, default_value_t = 10)]
    iters: u32,
    /// Tensors (layer buckets) per iteration, front layer first.
    #[arg(long, default_value_t = 4)]
    layers: u32,
    /// The daemons' network MTU (1500, or 9000 for jumbo frames; loopback carries either).
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Element type of the gradients: f32, f16 or bf16 (2-byte types: f32 accumulation, one rounding).
    #[arg(long, default_value = "f32", value_parser = dtype_arg)]
    dtype: DType,
    /// The reduction: sum, or average (the daemons divide once).
    #[arg(long, default_value = "sum", value_parser = op_arg)]
    op: ReduceOp,
    /// The collective: allreduce, reduce-scatter, allgather, broadcast or barrier.
    #[arg(long, default_value = "allreduce", value_parser = sim_collective_arg)]
    collective: Collective,
    /// Broadcast: the daemon rank whose local rank 0 sends its tensor.
    #[arg(long, default_value_t = 0)]
    root: u32,
}

#[derive(Args)]
struct DemoArgs {
    /// Number of hosts (ranks).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    hosts: u32,
    /// Megabytes of f32 gradients per iteration, split over --layers tensors.
    #[arg(long, default_value_t = 16.0)]
    size: f64,
    /// Random packet loss on the simulated network, percent.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Loss budget per transfer: a fraction (0.01) or a percentage ("1%"); 0 = reliable; at most
    /// 0.10.
    #[arg(long, default_value = "0.01", value_parser = budget_arg)]
    budget: f64,
    /// Allreduce iterations.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    iters: u32,
    /// Tensors (layer buckets) per iteration, front layer first.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    layers: u32,
    /// Link rate of the simulated network, Gbit/s.
    #[arg(long, default_value_t = 10.0)]
    link_gbps: f64,
    /// Seed of the simulation (data and faults).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Element type of the gradients: f32, f16 or bf16 (2-byte types: f32 accumulation, one rounding).
    #[arg(long, default_value = "f32", value_parser = dtype_arg)]
    dtype: DType,
    /// The reduction: sum, or average (each owner divides once).
    #[arg(long, default_value = "sum", value_parser = op_arg)]
    op: ReduceOp,
    /// The collective: allreduce, reduce-scatter, allgather, broadcast or barrier.
    #[arg(long, default_value = "allreduce", value_parser = sim_collective_arg)]
    collective: Collective,
    /// Broadcast: the rank whose tensor every rank receives.
    #[arg(long, default_value_t = 0)]
    root: u32,
}

/// `dlcpd simulate --collective`: a collective's name.
fn sim_collective_arg(s: &str) -> Result<Collective, String> {
    Collective::from_name(s).ok_or_else(|| {
        format!("unknown collective {s:?} (allreduce, reduce-scatter, allgather, broadcast, barrier)")
    })
}

/// `--dtype`: f32, f16 or bf16.
fn dtype_arg(s: &str) -> Result<DType, String> {
    DType::ALL
        .into_iter()
        .find(|d| d.name() == s)
        .ok_or_else(|| format!("unknown dtype {s:?} (f32, f16, bf16)"))
}

/// `--op`: sum or average.
fn op_arg(s: &str) -> Result<ReduceOp, String> {
    ReduceOp::ALL
        .into_iter()
        .find(|r| r.name() == s)
        .ok_or_else(|| format!("unknown op {s:?} (sum, average)"))
}

/// `--budget`: a fraction or a percentage, at most the hard cap (a bare `1`
/// is refused saying budgets are fractions).
fn budget_arg(s: &str) -> Result<f64, String> {
    dlcp::config::parse_budget(s).map_err(|e| e.to_string())
}

/// The demos' output: the banner, then the run writing its table as it goes.
/// A closed stdout ends the run quietly ([`dlcp::is_closed_stdout`]).
fn run_demo<S>(
    name: &str,
    verified: impl Fn(&S) -> bool,
    run: impl FnOnce(&mut std::io::Stdout) -> std::io::Result<S>,
) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout();
    let result =
        writeln!(out, "dlcpd {} — {}", dlcp::VERSION, dlcp::datapath_support()).and_then(|()| run(&mut out));
    match result {
        Ok(summary) if verified(&summary) => ExitCode::SUCCESS,
        Ok(_) => {
            eprintln!("dlcpd {name}: verification FAILED (see above)");
            ExitCode::FAILURE
        }
        Err(e) if dlcp::is_closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlcpd {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_service(path: &std::path::Path, rx_loss_pct: f64) -> ExitCode {
    let cfg = match dlcp::config::Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // Without RUST_LOG the filter is `log.level`, applied as the global max level
    // so that a reload can change it; RUST_LOG's directives win and stay fixed.
    let rust_log = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
    match &rust_log {
        Some(filters) => env_logger::Builder::new().parse_filters(filters).init(),
        None => {
            env_logger::Builder::new().filter_level(log::LevelFilter::Trace).init();
            log::set_max_level(dlcp::hot_reload::level_filter(cfg.log.level));
        }
    }
    log::info!("dlcpd {} — {}", dlcp::VERSION, dlcp::datapath_support());
    if !(0.0..=100.0).contains(&rx_loss_pct) {
        eprintln!("dlcpd: --debug-rx-loss {rx_loss_pct} out of range (allowed: 0 ..= 100)");
        return ExitCode::from(2);
    }
    let datapath = match dlcp::datapath::open(&cfg) {
        Ok(d) => FaultInjector::new(d).with_receive_loss(
            (rx_loss_pct * 1e4).round() as u32,
            0x5eed,
            u64::from(cfg.rank()),
        ),
        Err(e) => {
            log::error!("{}: datapath: {e}", path.display());
            return ExitCode::from(1);
        }
    };
    let mut svc = match dlcp::service::Service::new(cfg, datapath) {
        Ok(s) => s,
        Err(e) => {
            log::error!("{}: {e}", path.display());
            return ExitCode::from(1);
        }
    };
    svc.set_operations(path.to_owned(), dlcp::notify::Notifier::from_env(), rust_log.is_none());
    match svc.run(|_| false) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    // `--version` also says which datapaths this build has (DPDK is found at
    // build time, or not); `-V` stays one short line.
    let long_version = format!("{}\n{}", dlcp::VERSION, dlcp::datapath_support());
    let matches = Cli::command().long_version(long_version).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let command = match (cli.command, cli.config) {
        (Some(c), _) => c,
        (None, Some(path)) => return run_service(&path, cli.debug_rx_loss),
        (None, None) => {
            eprintln!("dlcpd: give --config FILE to run the service, or a subcommand (see --help)");
            return ExitCode::from(2);
        }
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match command {
        Command::Demo(a) => {
            let opts = DemoOptions {
                hosts: a.hosts,
                trainers: a.trainers_per_host,
                size_mb: a.size,
                loss_pct: a.loss,
                budget: a.budget,
                iters: a.iters,
                layers: a.layers,
                mtu: a.mtu,
                dtype: a.dtype,
                reduce: a.op,
                collective: a.collective,
                root: a.root,
            };
            if let Err(e) = opts.validate() {
                eprintln!("dlcpd demo: {e}");
                return ExitCode::from(2);
            }
            run_demo("demo", |s: &demo::DemoSummary| s.verified, |out| demo::run(&opts, out))
        }
        Command::Simulate(a) => {
            let opts = SimOptions {
                hosts: a.hosts,
                size_mb: a.size,
                loss_pct: a.loss,
                budget: a.budget,
                iters: a.iters,
                layers: a.layers,
                link_gbps: a.link_gbps,
                seed: a.seed,
                dtype: a.dtype,
                reduce: a.op,
                collective: a.collective,
                root: a.root,
            };
            if let Err(e) = opts.validate() {
                eprintln!("dlcpd simulate: {e}");
                return ExitCode::from(2);
            }
            run_demo("simulate", |s: &simulate::SimSummary| s.verified, |out| simulate::run(&opts, out))
        }
        Command::CheckConfig { file } => match dlcp::config::Config::load(&file) {
            Ok(cfg) => {
                let text = format!(
                    "# {}: OK — effective configuration (defaults filled in, secret redacted)\n{}",
                    file.display(),
                    cfg.to_toml_string()
                );
                match dlcp::write_stdout(&text) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("dlcpd check-config: writing to stdout: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
    }
}
