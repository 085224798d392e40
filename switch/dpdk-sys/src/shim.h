/* What the Rust bindings see: the DPDK headers the backend needs, and C wrappers
 * around DPDK's static-inline fast-path functions (which have no symbol to link). */
#ifndef INC_DPDK_SHIM_H
#define INC_DPDK_SHIM_H

#include <stdint.h>

#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

/* Receive up to nb mbufs from a queue (rte_eth_rx_burst). */
uint16_t inc_rte_eth_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t nb);
/* Hand up to nb mbufs to a queue; the driver owns the ones it accepted (rte_eth_tx_burst). */
uint16_t inc_rte_eth_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t nb);
/* One mbuf from a pool, or NULL (rte_pktmbuf_alloc). */
struct rte_mbuf *inc_rte_pktmbuf_alloc(struct rte_mempool *mp);
/* Return an mbuf (all its segments) to its pool (rte_pktmbuf_free). */
void inc_rte_pktmbuf_free(struct rte_mbuf *m);
/* Return n mbufs to their pools (rte_pktmbuf_free_bulk). */
void inc_rte_pktmbuf_free_bulk(struct rte_mbuf **m, unsigned int n);
/* Start of the first segment's data (rte_pktmbuf_mtod). */
uint8_t *inc_rte_pktmbuf_mtod(struct rte_mbuf *m);
/* Bytes of data in the first segment. */
uint16_t inc_rte_pktmbuf_data_len(const struct rte_mbuf *m);
/* Bytes of data in the whole packet. */
uint32_t inc_rte_pktmbuf_pkt_len(const struct rte_mbuf *m);
/* Number of segments. */
uint16_t inc_rte_pktmbuf_nb_segs(const struct rte_mbuf *m);
/* Room after the data start of a fresh single-segment mbuf (data room minus headroom). */
uint16_t inc_rte_pktmbuf_room(const struct rte_mbuf *m);
/* Make m a single-segment packet of len bytes (len must fit the room). */
void inc_rte_pktmbuf_set_len(struct rte_mbuf *m, uint16_t len);
/* The calling thread's rte_errno. */
int inc_rte_errno(void);
/* The calling thread's lcore id (LCORE_ID_ANY for unregistered threads). */
unsigned int inc_rte_lcore_id(void);
/* Default headroom reserved before packet data (RTE_PKTMBUF_HEADROOM). */
uint16_t inc_rte_pktmbuf_headroom(void);

#endif
