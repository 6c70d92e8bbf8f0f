//! `dlcpd`, the per-host dlcp daemon. See `dlcpd --help`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use dlcp::demo::{self, DemoOptions};

#[derive(Parser)]
#[command(
    name = "dlcpd",
    version = dlcp::VERSION,
    about = "Per-host bounded-loss allreduce daemon for distributed DNN training",
    long_about = "dlcpd all-reduces gradient shards between training hosts over a custom UDP \
                  protocol with priority classes carried in DSCP, completing as soon as enough \
                  has arrived within a bounded loss budget.\n\n\
                  This build runs the protocol core in a simulation (`demo`) and validates \
                  configuration files (`check-config`); the network service on sockets and DPDK \
                  follows."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run N simulated hosts doing allreduce rounds through the real protocol core, then print a summary table.
    Demo(DemoArgs),
    /// Validate a configuration file; print the effective configuration, or one `file:line:col: field: message` line.
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
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
    /// Loss budget per transfer, percent (0 = reliable, at most 10).
    #[arg(long, default_value_t = 1.0)]
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
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(a) => {
            let opts = DemoOptions {
                hosts: a.hosts,
                size_mb: a.size,
                loss_pct: a.loss,
                budget_pct: a.budget,
                iters: a.iters,
                layers: a.layers,
                link_gbps: a.link_gbps,
                seed: a.seed,
            };
            if let Err(e) = opts.validate() {
                eprintln!("dlcpd demo: {e}");
                return ExitCode::from(2);
            }
            println!("dlcpd {} — {}", dlcp::VERSION, dlcp::datapath_support());
            match demo::run(&opts, &mut std::io::stdout()) {
                Ok(summary) if summary.verified => ExitCode::SUCCESS,
                Ok(_) => {
                    eprintln!("dlcpd demo: verification FAILED (see above)");
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln!("dlcpd demo: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::CheckConfig { file } => match dlcp::config::Config::load(&file) {
            Ok(cfg) => {
                println!(
                    "# {}: OK — effective configuration (defaults filled in, secret redacted)",
                    file.display()
                );
                print!("{}", cfg.to_toml_string());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
    }
}
