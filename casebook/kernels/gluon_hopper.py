"""Gluon's Hopper TMA copies under one name across Triton releases: the H200 image's Triton 3.6 calls them
async_copy_global_to_shared / async_copy_shared_to_global, later releases async_load / async_store (and the old
store name raises). attention_fa3 imports these; gemm_pingpong keeps its own two lines until it next changes for
its own reasons (its bytes are hashed into stored H200 results that cannot be re-measured today)."""

from triton.experimental.gluon.language.nvidia.hopper import tma

tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
