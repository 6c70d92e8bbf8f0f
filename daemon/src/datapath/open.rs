//! Opening the datapath a configuration asks for (`datapath.kind`), with the
//! fallback of `auto` and typed reasons when it cannot.

use super::api::Datapath;
#[cfg(dpdk)]
use super::dpdk;
use super::socket;

/// Why [`open()`] could not open the datapath the configuration asks for.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `datapath.kind = "dpdk"` and the DPDK datapath cannot run (fail fast).
    #[error("datapath.kind = \"dpdk\": {0}")]
    Dpdk(DpdkUnavailable),
    /// The socket datapath could not be created.
    #[error(transparent)]
    Socket(#[from] socket::DatapathError),
}

/// Why the DPDK datapath cannot run.
#[derive(Debug, thiserror::Error)]
pub enum DpdkUnavailable {
    /// This build has no DPDK datapath (`dlcp-ffi` found no libdpdk).
    #[error("this build has no DPDK datapath ({probe})")]
    NotBuilt {
        /// What the build-time probe found ([`dlcp_ffi::DPDK_PROBE`]).
        probe: &'static str,
    },
    /// The DPDK datapath did not start (configuration, EAL, port).
    #[cfg(dpdk)]
    #[error(transparent)]
    Failed(#[from] dpdk::DpdkError),
}

/// Open the datapath the configuration asks for (`datapath.kind`):
/// * `socket`: UDP sockets;
/// * `dpdk`: the DPDK datapath, or an error saying why it cannot run (not built,
///   EAL or port failure) — fail fast;
/// * `auto`: DPDK when it was built, `datapath.dpdk.eal_args` names what to run on,
///   and the port comes up; otherwise one log line says why and sockets are used.
pub fn open(cfg: &dlcp_config::Config) -> Result<Box<dyn Datapath>, OpenError> {
    use dlcp_config::schema::DatapathKind;
    match cfg.datapath.kind {
        DatapathKind::Dpdk => return open_dpdk(cfg).map_err(OpenError::Dpdk),
        DatapathKind::Auto => {
            let why = if !dlcp_ffi::DPDK_BUILT {
                format!("no DPDK datapath in this build: {}", dlcp_ffi::DPDK_PROBE)
            } else if cfg.datapath.dpdk.eal_args.is_empty() {
                "datapath.dpdk.eal_args is empty (no DPDK device configured)".to_string()
            } else {
                match open_dpdk(cfg) {
                    Ok(d) => {
                        log::info!("datapath auto: using DPDK");
                        return Ok(d);
                    }
                    Err(e) => e.to_string(),
                }
            };
            log::info!("datapath auto: using sockets ({why})");
        }
        DatapathKind::Socket => {}
    }
    Ok(Box::new(socket::open(cfg)?))
}

#[cfg(dpdk)]
fn open_dpdk(cfg: &dlcp_config::Config) -> Result<Box<dyn Datapath>, DpdkUnavailable> {
    Ok(Box::new(dpdk::open(cfg)?))
}

#[cfg(not(dpdk))]
fn open_dpdk(_cfg: &dlcp_config::Config) -> Result<Box<dyn Datapath>, DpdkUnavailable> {
    Err(DpdkUnavailable::NotBuilt { probe: dlcp_ffi::DPDK_PROBE })
}
