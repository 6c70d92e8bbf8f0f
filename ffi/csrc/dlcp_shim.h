/* dlcp's view of DPDK: the public headers bindgen reads, plus a small shim over
 * DPDK's static inline functions and macros (rx/tx burst, mbuf helpers,
 * rte_errno, offload flag constants), which have no symbol in the shared
 * libraries. Compiled by ffi/build.rs with every cflag `pkg-config libdpdk` gives. */
#ifndef DLCP_SHIM_H
#define DLCP_SHIM_H

#include <stdint.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_lcore.h>

uint16_t dlcp_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
uint16_t dlcp_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
struct rte_mbuf *dlcp_pktmbuf_alloc(struct rte_mempool *mp);
void dlcp_pktmbuf_free(struct rte_mbuf *m);
/* Pointer to the first data byte of a (single-segment) mbuf. */
uint8_t *dlcp_pktmbuf_mtod(struct rte_mbuf *m);
/* Data length of the first segment and packet length. */
uint16_t dlcp_pktmbuf_data_len(const struct rte_mbuf *m);
uint32_t dlcp_pktmbuf_pkt_len(const struct rte_mbuf *m);
uint16_t dlcp_pktmbuf_nb_segs(const struct rte_mbuf *m);
/* Append len bytes; NULL if the tailroom is too small. */
uint8_t *dlcp_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
/* Request IPv4 + UDP checksum offload for an Ethernet/IPv4/UDP frame. */
void dlcp_mbuf_tx_cksum_offload(struct rte_mbuf *m, uint8_t l2_len, uint8_t l3_len);
/* Receive flags: 1 = IP checksum bad, 2 = L4 checksum bad (as reported by the NIC). */
int dlcp_mbuf_rx_cksum_bad(const struct rte_mbuf *m);
int dlcp_errno(void);

/* Offload capability bits (RTE_ETH_TX_OFFLOAD_*), as constants bindgen can read. */
extern const uint64_t dlcp_TX_OFFLOAD_IPV4_CKSUM;
extern const uint64_t dlcp_TX_OFFLOAD_UDP_CKSUM;
extern const uint64_t dlcp_RX_OFFLOAD_CHECKSUM;
extern const uint16_t dlcp_MBUF_DEFAULT_BUF_SIZE;

#endif
