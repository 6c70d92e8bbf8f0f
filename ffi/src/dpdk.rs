//! Safe wrappers over DPDK: EAL, mempool, port with its queues, mbuf.
//!
//! Ownership rules that make the wrappers sound:
//! * EAL is initialised at most once per process ([`Eal::init`]); every other
//!   wrapper needs the `&'static Eal` it returns, so nothing touches DPDK first.
//! * A [`Mempool`] lives until the process exits (DPDK's own lifetime is the
//!   process: EAL cannot be initialised again), so no [`Mbuf`] outlives its pool.
//! * An [`Mbuf`] is owned: dropping it frees it, sending it hands it to the NIC.
//! * A [`Port`] is configured and started by [`Port::open`] and stopped and closed
//!   on drop; its queues are polled through `&mut self`, so one thread at a time.

use std::ffi::{CStr, CString, c_char, c_int};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::sys;

/// Errors of the DPDK wrappers. Each names the call that failed and DPDK's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// `rte_eal_init` failed (bad arguments, no devices, no memory, ...).
    EalInit {
        /// DPDK's error text (`rte_strerror(rte_errno)`).
        reason: String,
    },
    /// EAL was already initialised (or its initialisation already failed) in
    /// this process; DPDK allows one attempt per process.
    EalAlreadyTried {
        /// What the first attempt gave.
        first: String,
    },
    /// An argument cannot be passed to C (contains a NUL byte).
    BadArgument(String),
    /// The port id names no device EAL found (check `--vdev`/`-a` and the PMD).
    NoSuchPort {
        /// The port asked for.
        port: u16,
        /// How many ports EAL found.
        available: u16,
    },
    /// A DPDK call on a port failed.
    Port {
        /// The DPDK function.
        call: &'static str,
        /// The port.
        port: u16,
        /// DPDK's error text.
        reason: String,
    },
    /// `rte_pktmbuf_pool_create` failed.
    Mempool {
        /// DPDK's error text.
        reason: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::EalInit { reason } => write!(f, "DPDK EAL initialisation failed: {reason}"),
            Error::EalAlreadyTried { first } => {
                write!(f, "DPDK EAL can be initialised once per process and was already ({first})")
            }
            Error::BadArgument(a) => write!(f, "EAL argument {a:?} contains a NUL byte"),
            Error::NoSuchPort { port, available } => write!(
                f,
                "DPDK port {port} does not exist (EAL found {available} port(s); check --vdev/-a in datapath.dpdk.eal_args)"
            ),
            Error::Port { call, port, reason } => write!(f, "{call}(port {port}) failed: {reason}"),
            Error::Mempool { reason } => write!(f, "rte_pktmbuf_pool_create failed: {reason}"),
        }
    }
}

impl std::error::Error for Error {}

fn strerror(code: c_int) -> String {
    // SAFETY: rte_strerror accepts any value and returns a pointer to a static or
    // thread-local NUL-terminated string, valid until the next call on this thread;
    // it is copied out at once.
    unsafe { CStr::from_ptr(sys::rte_strerror(code.abs())) }.to_string_lossy().into_owned()
}

fn last_error() -> String {
    // SAFETY: dlcp_errno reads DPDK's per-thread rte_errno; no preconditions.
    strerror(unsafe { sys::dlcp_errno() })
}

/// Proof that EAL is initialised in this process (obtained from [`Eal::init`]).
#[derive(Debug)]
pub struct Eal {
    args: Vec<String>,
}

static EAL: Mutex<Option<Result<&'static Eal, String>>> = Mutex::new(None);

impl Eal {
    /// Initialise EAL with `args` (argv\[0\] is added). Once per process: a second
    /// call, whatever the first gave, returns [`Error::EalAlreadyTried`].
    pub fn init(args: &[String]) -> Result<&'static Eal, Error> {
        let mut state = EAL.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(first) = state.as_ref() {
            let first = match first {
                Ok(e) => format!("initialised with {:?}", e.args),
                Err(r) => format!("failed: {r}"),
            };
            return Err(Error::EalAlreadyTried { first });
        }
        let mut owned = vec![CString::new("dlcpd").expect("no NUL")];
        for a in args {
            owned.push(CString::new(a.as_str()).map_err(|_| Error::BadArgument(a.clone()))?);
        }
        // EAL may keep pointers into argv (and permutes it): give it a copy that
        // lives as long as the process.
        let argv: &'static mut [*mut c_char] =
            Vec::leak(owned.into_iter().map(CString::into_raw).chain([std::ptr::null_mut()]).collect());
        let argc = (argv.len() - 1) as c_int;
        // SAFETY: argv holds argc valid NUL-terminated strings followed by NULL,
        // leaked so they outlive EAL; this is the only rte_eal_init call in the
        // process (guarded by the EAL mutex held here).
        let rc = unsafe { sys::rte_eal_init(argc, argv.as_mut_ptr()) };
        if rc < 0 {
            let reason = last_error();
            *state = Some(Err(reason.clone()));
            return Err(Error::EalInit { reason });
        }
        let eal: &'static Eal = Box::leak(Box::new(Eal { args: args.to_vec() }));
        *state = Some(Ok(eal));
        Ok(eal)
    }

    /// The arguments EAL was initialised with.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Ports EAL found (their ids are `0 .. count` for the devices dlcp uses).
    pub fn port_count(&self) -> u16 {
        // SAFETY: EAL is initialised (self exists); no other precondition.
        unsafe { sys::rte_eth_dev_count_avail() }
    }
}

/// A pool of packet buffers. Lives until the process exits (see module docs).
#[derive(Debug, Clone, Copy)]
pub struct Mempool {
    raw: NonNull<sys::rte_mempool>,
}

// SAFETY: DPDK mempools are multi-producer/multi-consumer safe (the default
// ring_mp_mc ops); the pointer is never freed (see `Mempool::new`).
unsafe impl Send for Mempool {}
// SAFETY: as above; every operation through &Mempool is thread-safe in DPDK.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Create a pool of `n` mbufs with `data_room` bytes each (including DPDK's
    /// headroom) and a per-lcore cache of `cache` on NUMA socket `socket` (-1: any).
    pub fn new(
        _eal: &'static Eal,
        name: &str,
        n: u32,
        cache: u32,
        data_room: u16,
        socket: i32,
    ) -> Result<Mempool, Error> {
        let cname = CString::new(name).map_err(|_| Error::BadArgument(name.to_string()))?;
        // SAFETY: EAL is initialised; cname is a valid C string for the call's
        // duration (DPDK copies the name).
        let raw = unsafe { sys::rte_pktmbuf_pool_create(cname.as_ptr(), n, cache, 0, data_room, socket) };
        NonNull::new(raw).map(|raw| Mempool { raw }).ok_or_else(|| Error::Mempool { reason: last_error() })
    }

    /// Default data room: 2048 bytes of data plus DPDK's headroom.
    pub fn default_data_room() -> u16 {
        // SAFETY: reads an immutable constant defined in the shim.
        unsafe { sys::dlcp_MBUF_DEFAULT_BUF_SIZE }
    }

    /// Take an empty mbuf, or `None` if the pool is exhausted.
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: raw is a live pool (never freed).
        NonNull::new(unsafe { sys::dlcp_pktmbuf_alloc(self.raw.as_ptr()) }).map(Mbuf)
    }

    /// Mbufs currently in the pool.
    pub fn available(&self) -> u32 {
        // SAFETY: raw is a live pool.
        unsafe { sys::rte_mempool_avail_count(self.raw.as_ptr()) }
    }
}

/// One packet buffer (single segment as built by dlcp; received ones may chain).
pub struct Mbuf(NonNull<sys::rte_mbuf>);

// SAFETY: an mbuf is owned by exactly one Mbuf value; DPDK allows freeing it from
// any thread (the mempool is thread-safe).
unsafe impl Send for Mbuf {}

impl fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mbuf({} bytes)", self.data().len())
    }
}

impl Mbuf {
    /// The bytes of the first segment.
    pub fn data(&self) -> &[u8] {
        // SAFETY: self owns a live mbuf; mtod points at data_len initialised
        // bytes of its buffer, which nothing else accesses while self is borrowed.
        unsafe {
            let p = self.0.as_ptr();
            let len = sys::dlcp_pktmbuf_data_len(p) as usize;
            std::slice::from_raw_parts(sys::dlcp_pktmbuf_mtod(p), len)
        }
    }

    /// Total packet length (all segments).
    pub fn pkt_len(&self) -> u32 {
        // SAFETY: self owns a live mbuf.
        unsafe { sys::dlcp_pktmbuf_pkt_len(self.0.as_ptr()) }
    }

    /// Number of segments.
    pub fn segments(&self) -> u16 {
        // SAFETY: self owns a live mbuf.
        unsafe { sys::dlcp_pktmbuf_nb_segs(self.0.as_ptr()) }
    }

    /// Grow the packet by `len` bytes at the end and return them (zeroed), or
    /// `None` if the buffer's tailroom is too small.
    pub fn append(&mut self, len: u16) -> Option<&mut [u8]> {
        // SAFETY: self owns a live mbuf exclusively (&mut); append returns a
        // pointer to len bytes inside the buffer or NULL.
        let p = unsafe { sys::dlcp_pktmbuf_append(self.0.as_ptr(), len) };
        let p = NonNull::new(p)?;
        // SAFETY: p points at len writable bytes of our buffer, borrowed via &mut self.
        let s = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len as usize) };
        s.fill(0);
        Some(s)
    }

    /// Ask the NIC to compute the IPv4 header and UDP checksums of this
    /// Ethernet/IPv4/UDP frame (the UDP checksum field must hold the pseudo-header sum).
    pub fn request_cksum_offload(&mut self, l2_len: u8, l3_len: u8) {
        // SAFETY: self owns a live mbuf exclusively.
        unsafe { sys::dlcp_mbuf_tx_cksum_offload(self.0.as_ptr(), l2_len, l3_len) }
    }

    /// Checksum verdict of the NIC on receive: bit 0 = IPv4 bad, bit 1 = L4 bad.
    pub fn rx_cksum_bad(&self) -> u8 {
        // SAFETY: self owns a live mbuf.
        (unsafe { sys::dlcp_mbuf_rx_cksum_bad(self.0.as_ptr()) }) as u8
    }

    fn into_raw(self) -> *mut sys::rte_mbuf {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: self owns the mbuf (chain) and gives it back exactly once.
        unsafe { sys::dlcp_pktmbuf_free(self.0.as_ptr()) }
    }
}

/// How to set up a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// RX queues.
    pub rx_queues: u16,
    /// TX queues.
    pub tx_queues: u16,
    /// Descriptors per RX queue.
    pub rx_ring_size: u16,
    /// Descriptors per TX queue.
    pub tx_ring_size: u16,
    /// Enable IPv4+UDP TX checksum offload if the device offers it.
    pub tx_cksum_offload: bool,
    /// Enable promiscuous mode (needed on af_packet/tap so frames for our MAC arrive
    /// when the kernel interface has another one).
    pub promiscuous: bool,
}

/// What a port can do and how it was set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Device name (e.g. `net_ring0`).
    pub name: String,
    /// Driver name (e.g. `net_af_packet`).
    pub driver: String,
    /// The port's MAC address.
    pub mac: [u8; 6],
    /// Largest MTU the device allows.
    pub max_mtu: u16,
    /// Most RX/TX queues the device allows.
    pub max_queues: (u16, u16),
    /// IPv4 + UDP TX checksum offload enabled.
    pub tx_cksum_offload: bool,
}

/// Port-level counters from the PMD (`rte_eth_stats_get`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub ipackets: u64,
    /// Packets sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Packets dropped by the NIC for lack of RX descriptors.
    pub imissed: u64,
    /// Receive errors.
    pub ierrors: u64,
    /// Send errors.
    pub oerrors: u64,
    /// RX mbuf allocation failures.
    pub rx_nombuf: u64,
}

/// A configured, started Ethernet port. Stopped and closed on drop.
#[derive(Debug)]
pub struct Port {
    id: u16,
    info: PortInfo,
    cfg: PortConfig,
}

fn port_err(call: &'static str, port: u16, rc: c_int) -> Error {
    Error::Port { call, port, reason: strerror(rc) }
}

impl Port {
    /// Configure `id` with `cfg`'s queues (RX buffers from `pool`) and start it.
    pub fn open(eal: &'static Eal, id: u16, pool: Mempool, cfg: &PortConfig) -> Result<Port, Error> {
        // SAFETY: EAL is initialised; any id may be asked about.
        if unsafe { sys::rte_eth_dev_is_valid_port(id) } == 0 {
            return Err(Error::NoSuchPort { port: id, available: eal.port_count() });
        }
        let mut dev = sys::rte_eth_dev_info::default();
        // SAFETY: id is valid; dev is a properly sized, writable rte_eth_dev_info.
        let rc = unsafe { sys::rte_eth_dev_info_get(id, &mut dev) };
        if rc != 0 {
            return Err(port_err("rte_eth_dev_info_get", id, rc));
        }
        // SAFETY: immutable constants defined in the shim.
        let want = unsafe { sys::dlcp_TX_OFFLOAD_IPV4_CKSUM | sys::dlcp_TX_OFFLOAD_UDP_CKSUM };
        let offload = cfg.tx_cksum_offload && dev.tx_offload_capa & want == want;
        let mut conf = sys::rte_eth_conf::default();
        if offload {
            conf.txmode.offloads = want;
        }
        // SAFETY: id is valid; conf is initialised and outlives the call.
        let rc = unsafe { sys::rte_eth_dev_configure(id, cfg.rx_queues, cfg.tx_queues, &conf) };
        if rc != 0 {
            return Err(port_err("rte_eth_dev_configure", id, rc));
        }
        // SAFETY: id is valid.
        let socket = unsafe { sys::rte_eth_dev_socket_id(id) };
        let socket = if socket < 0 { 0 } else { socket as u32 };
        for q in 0..cfg.rx_queues {
            // SAFETY: the port is configured with rx_queues queues; a NULL rxconf
            // means the driver's defaults; pool lives for the process.
            let rc = unsafe {
                sys::rte_eth_rx_queue_setup(
                    id,
                    q,
                    cfg.rx_ring_size,
                    socket,
                    std::ptr::null(),
                    pool.raw.as_ptr(),
                )
            };
            if rc != 0 {
                return Err(port_err("rte_eth_rx_queue_setup", id, rc));
            }
        }
        for q in 0..cfg.tx_queues {
            // SAFETY: as above, for the TX queues.
            let rc =
                unsafe { sys::rte_eth_tx_queue_setup(id, q, cfg.tx_ring_size, socket, std::ptr::null()) };
            if rc != 0 {
                return Err(port_err("rte_eth_tx_queue_setup", id, rc));
            }
        }
        // SAFETY: the port is configured with all its queues set up.
        let rc = unsafe { sys::rte_eth_dev_start(id) };
        if rc != 0 {
            return Err(port_err("rte_eth_dev_start", id, rc));
        }
        let port = Port { id, cfg: cfg.clone(), info: PortInfo::default_for(id, &dev, offload) };
        if cfg.promiscuous {
            // SAFETY: the port is started. Failure is not fatal (not every PMD has it).
            let rc = unsafe { sys::rte_eth_promiscuous_enable(id) };
            if rc != 0 {
                log_note(&format!("port {id}: promiscuous mode not available: {}", strerror(rc)));
            }
        }
        Ok(port)
    }

    /// The port id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Device facts and the offloads enabled.
    pub fn info(&self) -> &PortInfo {
        &self.info
    }

    /// The configuration the port was opened with.
    pub fn config(&self) -> &PortConfig {
        &self.cfg
    }

    /// Whether the link is up now.
    pub fn link_up(&self) -> bool {
        let mut link = sys::rte_eth_link::default();
        // SAFETY: the port is valid; link is writable.
        let rc = unsafe { sys::rte_eth_link_get_nowait(self.id, &mut link) };
        rc == 0 && link.link_status() != 0
    }

    /// Receive up to `max` (≤ 512) packets from `queue` into `out`; returns how many.
    pub fn rx_burst(&mut self, queue: u16, out: &mut Vec<Mbuf>, max: usize) -> usize {
        assert!(queue < self.cfg.rx_queues, "rx queue {queue} not configured");
        let mut raw = [std::ptr::null_mut::<sys::rte_mbuf>(); 512];
        let max = max.min(raw.len());
        // SAFETY: the port is started and queue exists; raw has room for max
        // pointers; &mut self keeps the queue single-threaded.
        let n = unsafe { sys::dlcp_rx_burst(self.id, queue, raw.as_mut_ptr(), max as u16) } as usize;
        // The driver handed us n owned mbufs.
        out.extend(raw[..n].iter().filter_map(|&p| NonNull::new(p)).map(Mbuf));
        n
    }

    /// Send the packets at the front of `pkts` on `queue`; those the queue took
    /// are removed from `pkts` (the NIC owns them now), the rest stay for a retry.
    /// Returns how many were taken.
    pub fn tx_burst(&mut self, queue: u16, pkts: &mut Vec<Mbuf>) -> usize {
        assert!(queue < self.cfg.tx_queues, "tx queue {queue} not configured");
        let mut raw = [std::ptr::null_mut::<sys::rte_mbuf>(); 512];
        let n = pkts.len().min(raw.len());
        for (r, m) in raw.iter_mut().zip(pkts.iter()) {
            *r = m.0.as_ptr();
        }
        // SAFETY: the port is started and queue exists; raw holds n live mbufs we
        // own; the driver takes ownership of the first `sent` of them.
        let sent = unsafe { sys::dlcp_tx_burst(self.id, queue, raw.as_mut_ptr(), n as u16) } as usize;
        for m in pkts.drain(..sent) {
            let _ = m.into_raw(); // now owned by the driver
        }
        sent
    }

    /// The PMD's counters.
    pub fn stats(&self) -> PortStats {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: the port is valid; s is writable.
        if unsafe { sys::rte_eth_stats_get(self.id, &mut s) } != 0 {
            return PortStats::default();
        }
        PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the port was started by Port::open and is stopped and closed
        // exactly once here; no mbufs of its queues are referenced by us.
        unsafe {
            sys::rte_eth_dev_stop(self.id);
            sys::rte_eth_dev_close(self.id);
        }
    }
}

impl PortInfo {
    fn default_for(id: u16, dev: &sys::rte_eth_dev_info, tx_cksum_offload: bool) -> PortInfo {
        let mut mac = sys::rte_ether_addr::default();
        // SAFETY: id is a valid port; mac is writable.
        unsafe { sys::rte_eth_macaddr_get(id, &mut mac) };
        let mut name = [0 as c_char; 64];
        // SAFETY: RTE_ETH_NAME_MAX_LEN is 64; name has room for it.
        let rc = unsafe { sys::rte_eth_dev_get_name_by_port(id, name.as_mut_ptr()) };
        let name = if rc == 0 {
            // SAFETY: DPDK wrote a NUL-terminated name into the buffer.
            unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned()
        } else {
            format!("port{id}")
        };
        let driver = if dev.driver_name.is_null() {
            "?".to_string()
        } else {
            // SAFETY: driver_name points at the driver's static NUL-terminated name.
            unsafe { CStr::from_ptr(dev.driver_name) }.to_string_lossy().into_owned()
        };
        PortInfo {
            name,
            driver,
            mac: mac.addr_bytes,
            max_mtu: dev.max_mtu,
            max_queues: (dev.max_rx_queues, dev.max_tx_queues),
            tx_cksum_offload,
        }
    }
}

fn log_note(s: &str) {
    eprintln!("dlcp-ffi: {s}");
}
