/* C wrappers around DPDK's static-inline functions; see shim.h. */
#include "shim.h"

uint16_t inc_rte_eth_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t nb)
{
	return rte_eth_rx_burst(port, queue, pkts, nb);
}

uint16_t inc_rte_eth_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t nb)
{
	return rte_eth_tx_burst(port, queue, pkts, nb);
}

struct rte_mbuf *inc_rte_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

void inc_rte_pktmbuf_free(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

void inc_rte_pktmbuf_free_bulk(struct rte_mbuf **m, unsigned int n)
{
	rte_pktmbuf_free_bulk(m, n);
}

uint8_t *inc_rte_pktmbuf_mtod(struct rte_mbuf *m)
{
	return rte_pktmbuf_mtod(m, uint8_t *);
}

uint16_t inc_rte_pktmbuf_data_len(const struct rte_mbuf *m)
{
	return m->data_len;
}

uint32_t inc_rte_pktmbuf_pkt_len(const struct rte_mbuf *m)
{
	return m->pkt_len;
}

uint16_t inc_rte_pktmbuf_nb_segs(const struct rte_mbuf *m)
{
	return m->nb_segs;
}

uint16_t inc_rte_pktmbuf_room(const struct rte_mbuf *m)
{
	return (uint16_t)(m->buf_len - m->data_off);
}

void inc_rte_pktmbuf_set_len(struct rte_mbuf *m, uint16_t len)
{
	m->data_len = len;
	m->pkt_len = len;
}

int inc_rte_errno(void)
{
	return rte_errno;
}

unsigned int inc_rte_lcore_id(void)
{
	return rte_lcore_id();
}

uint16_t inc_rte_pktmbuf_headroom(void)
{
	return RTE_PKTMBUF_HEADROOM;
}
