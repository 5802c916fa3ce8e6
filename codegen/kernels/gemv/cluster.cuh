// Thread-block cluster helpers of the decode GEMVs (kernel.cu's CLUSTER split-K, skinny.cu's SPLITK): a cluster
// barrier's two halves, every thread of the cluster arriving (a release: this thread's earlier accesses, the reads of
// the peers' shared memory among them, performed before it) and waiting (an acquire), apart where the wait can come
// later; both at once; this CTA's rank; a shared-memory address of this CTA's as the same variable's in CTA `rank`'s;
// an f32 there (volatile: kept in order with the barriers; no memory clobber, so that the loads of one element's
// slices go out together)
__device__ __forceinline__ void gemv_cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void gemv_cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
__device__ __forceinline__ void gemv_cluster_sync() {
  gemv_cluster_arrive();
  gemv_cluster_wait();
}
__device__ __forceinline__ unsigned gemv_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned gemv_mapa(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float gemv_ld_cluster(unsigned addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}
