"""Every vLLM engine argument, accounted for: a ``plan()`` keyword, or listed
here with the reason it is not one.

A field of vLLM's ``EngineArgs`` (``vllm/engine/arg_utils.py``) is, for
kvexplore, one of:

- a ``plan()`` keyword of the same name
  (:data:`kvexplore.planning.inputs.PLAN_KEYWORDS`), or one of
  :data:`PLANNED_AS` (another name for it);
- in :data:`NOT_CACHE_ARGUMENTS`: it changes neither the KV cache's layout
  (layers, specs, groups, block and page sizes, tensors), nor its size (the
  memory the worker leaves to it: weights per rank, the profiled activation,
  CUDA-graph and non-torch memory), nor whether a request is admitted;
- in :data:`UNPLANNED_CACHE_ARGUMENTS`: it changes (or may change, where the
  reason says it was not analysed) one of those, and ``plan()`` does not take
  it, so a plan is the deployment with vLLM's default for it.

The tables cover the ``EngineArgs`` of every release of the window;
``tests/test_engine_arguments.py`` fails on a field of the installed
release's ``EngineArgs`` that is in none of them.
"""

from __future__ import annotations


def _each(groups: dict[tuple[str, ...], str]) -> dict[str, str]:
    return {name: why for names, why in groups.items() for name in names}


#: ``EngineArgs`` fields ``plan()`` takes under another name: field -> how.
PLANNED_AS: dict[str, str] = {
    "model": "plan()'s first argument: a catalog id, config.json, its directory or a hub id",
    "num_gpu_blocks_override": "plan(num_blocks=...)",
}

#: ``EngineArgs`` fields that change neither the KV cache's layout, its size
#: nor admission: name -> why.
NOT_CACHE_ARGUMENTS: dict[str, str] = _each({
    ("seed",): "sampling randomness",
    ("served_model_name",): "the name the API serves the model as",
    ("tokenizer", "tokenizer_mode", "tokenizer_revision", "skip_tokenizer_init",
     "renderer_num_workers", "tokens_only"):
        "the tokenizer and the API's text handling run on the host",
    ("hf_config_path", "config_format"):
        "where vLLM reads the model's config from; plan() is given the config itself",
    ("trust_remote_code",):
        "permission to run a repository's own code; kvexplore builds vLLM's own model classes",
    ("model_weights", "revision", "code_revision", "hf_token", "download_dir",
     "load_format", "safetensors_load_strategy", "safetensors_prefetch_num_threads",
     "safetensors_prefetch_block_size", "shuffle_safetensors_files",
     "checkpoint_prepare_on_startup", "ignore_patterns", "model_loader_extra_config",
     "use_tqdm_on_load", "pt_load_map_location", "max_parallel_loading_workers",
     "enable_ep_weight_filter"):
        "where and how the checkpoint's weights are read; the parameters each rank holds are "
        "the model class's, which kvexplore builds with dummy weights on the meta device",
    ("allow_deprecated_quantization",): "permission to use a deprecated method, not the method",
    ("allowed_local_media_path", "allowed_media_domains", "media_io_kwargs",
     "mm_processor_cache_gb", "mm_processor_cache_type", "mm_hasher_algorithm",
     "mm_shm_cache_max_object_size_mb", "mm_tensor_ipc", "mm_processor_device",
     "mm_device_do_normalize", "interleave_mm_strings", "enable_mm_embeds",
     "video_pruning_rate", "video_pruning_method", "enable_mm_processor_stats"):
        "how multimodal inputs are fetched, processed, hashed and cached on the host",
    ("enable_prompt_embeds",): "accepting embeddings as prompts, not the cache",
    ("distributed_executor_backend", "master_addr", "master_port", "nnodes", "node_rank",
     "distributed_timeout_seconds", "cpu_distributed_timeout_seconds", "numa_bind",
     "numa_bind_nodes", "numa_bind_cpus", "device_ids", "ray_workers_use_nsight",
     "worker_cls", "worker_extension_cls", "_api_process_count", "_api_process_rank",
     "dcp_comm_backend", "enable_nccl_comm_suspend", "disable_nccl_for_dp_synchronization",
     "dp_sync_interval"):
        "where processes run and how they communicate; each worker's cache is the same",
    ("data_parallel_rank", "data_parallel_start_rank", "data_parallel_size_local",
     "data_parallel_address", "data_parallel_rpc_port", "data_parallel_hybrid_lb",
     "data_parallel_external_lb", "data_parallel_multi_port_external_lb",
     "data_parallel_backend"):
        "which DP rank runs where and how requests are balanced; every DP rank's worker "
        "plans alike (plan(data_parallel_size=...) is rank 0's)",
    ("expert_placement_strategy",):
        "which experts each EP rank holds (linear or round robin); every rank holds as many",
    ("enable_batch_sharded_sampling", "return_sampling_mask", "logprobs_mode",
     "max_logprobs", "use_fp64_gumbel", "logits_processors"):
        "what the sampler computes and returns per step",
    ("disable_cascade_attn",):
        "a decode kernel choice (cascade attention over shared prefixes) on the same cache",
    ("prefix_caching_hash_algo",): "the hash function of block hashes, not the blocks",
    ("prefix_cache_retention_interval",): "when cached blocks may be evicted, not how many exist",
    ("long_prefill_token_threshold", "long_prefill_token_threshold_adaptive",
     "max_num_active_seqs", "max_num_queued_reqs", "max_num_queued_tokens",
     "scheduling_policy", "scheduler_cls", "prefill_schedule_interval", "async_scheduling",
     "stream_interval", "disable_chunked_mm_input"):
        "the order and pace in which the scheduler runs admitted requests",
    ("max_cpu_loras",): "LoRA adapters cached in host memory",
    ("default_mm_loras",): "which LoRA a modality uses, within the slots enable_lora reserves",
    ("max_num_inflight_kv_loads",): "how many KV loads a connector runs at once",
    ("kv_events_config",): "publishing cache events, not the cache",
    ("disable_log_stats", "aggregate_engine_logging", "show_hidden_metrics_for_version",
     "otlp_traces_endpoint", "collect_detailed_traces", "per_request_spec_decode_metrics",
     "kv_cache_metrics", "kv_cache_metrics_sample", "custom_histogram_buckets",
     "cudagraph_metrics", "enable_layerwise_nvtx_tracing", "enable_mfu_metrics",
     "enable_logging_iteration_details", "jit_monitor_mode", "jit_monitor_verbose",
     "profiler_config", "logging_config", "log_level", "log_config_file",
     "enable_trace_replay"):
        "logging, metrics, tracing and profiling",
    ("reasoning_parser", "reasoning_parser_plugin", "reasoning_config",
     "structured_outputs_config", "generation_config", "override_generation_config",
     "aux_output_config", "io_processor_plugin", "watermark_config"):
        "how outputs are generated, parsed or marked per request",
    ("enable_sleep_mode", "sleep_mode_backend", "sleep_mode_offload_cudagraph",
     "sleep_preserve_parameter_names", "enable_cumem_allocator"):
        "releasing and restoring memory while the engine sleeps; the cache sized at start-up "
        "is the same",
    ("shutdown_timeout", "watchdog_config", "fault_tolerance_config", "enable_fault_tolerance",
     "weight_transfer_config", "fail_on_environ_validation"):
        "the engine's lifecycle, weight updates and environment checks",
    ("enable_shm_tensor_arena",): "a host shared-memory arena for inputs",
    ("additional_config",): "settings read by out-of-tree platform plugins, not vLLM's CUDA platform",
    ("monokernel",): "a decode kernel of AMD MI355X; kvexplore plans NVIDIA GPUs",
})

#: ``EngineArgs`` fields that change (or, where the reason says so, may
#: change) the KV cache's layout, size or admission but are not ``plan()``
#: keywords: name -> what they change and why ``plan()`` does not take them.
UNPLANNED_CACHE_ARGUMENTS: dict[str, str] = _each({
    ("prefill_context_parallel_size",):
        "shards each request's KV over PCP ranks (as decode_context_parallel_size does); "
        "offload_config takes it for the connector, plan() does not shard by it",
    ("dcp_kv_cache_interleave_size", "cp_kv_cache_interleave_size"):
        "how many tokens go to one context-parallel rank in turn, checked against the block "
        "size; plan() keeps vLLM's default",
    ("dcp_q_replicate",):
        "replicates the MLA query projection in each DCP group: more weight bytes per rank",
    ("kv_cache_dtype_skip_layers",):
        "keeps named layers' KV unquantized under a quantized kv_cache_dtype: per-layer specs "
        "and page padding",
    ("disable_sliding_window",): "sliding-window layers become full attention: specs and groups",
    ("disable_hybrid_kv_cache_manager",):
        "one group for all layers instead of the hybrid manager's groups",
    ("swa_bounded_replay",):
        "whether sliding-window KV of supporting models (DeepSeek-V4.1) is prefix-cached",
    ("kv_sharing_fast_prefill",): "layers that share KV (Gemma 3n): which layers hold a cache",
    ("enable_mamba_shared_prefix_checkpoint",): "extra Mamba checkpoints a request pins",
    ("use_replayssm", "replayssm_buffer_len"):
        "ReplaySSM keeps a history of SSM inputs in the Mamba state: its shapes and page size",
    ("mamba_backend", "mamba_ssu_algorithm", "enable_mamba_cache_stochastic_rounding",
     "mamba_cache_philox_rounds", "mamba_config"):
        "Mamba kernels and state rounding; not analysed for their effect on the state's "
        "shapes, so not planned",
    ("gdn_prefill_backend", "kda_prefill_backend", "kda_decode_backend"):
        "the linear-attention kernels; the GDN prefill backend decides the checkpoint "
        "alignment of Mamba blocks (kvexplore takes vLLM's choice for the GPU)",
    ("attention_config", "kernel_config", "moe_backend", "linear_backend", "ir_op_priority",
     "sparse_indexer_topk_backend"):
        "kernel selections: an attention setting can change the backend and so the block "
        "and page sizes; the others are not analysed for their weight layouts",
    ("enable_chunked_prefill",):
        "vLLM's default max_num_batched_tokens (the profiled batch) and Mamba prefix caching "
        "depend on it",
    ("max_num_scheduled_tokens",): "not analysed: may change the batch vLLM profiles",
    ("watermark", "scheduler_reserve_full_isl", "cache_aware_admission_threshold",
     "cache_aware_admission_window"):
        "when the scheduler admits a request at run time (free-block headroom, reserving the "
        "whole prompt); the plan's admission is the start-up check",
    ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
        "shorthands of compilation_config's fields of the same names; "
        "plan(compilation_config=...) takes them",
    ("optimization_level", "performance_mode"):
        "the compilation level and its CUDA-graph defaults (-O); plan() takes the "
        "release's default level, and compilation_config / enforce_eager override it",
    ("enable_dbo", "ubatch_size", "dbo_decode_token_threshold", "dbo_prefill_token_threshold"):
        "micro-batching of the forward: the activation and CUDA-graph memory profiled",
    ("disable_custom_all_reduce",):
        "custom all-reduce buffers are GPU memory outside torch, which the profile subtracts",
    ("all2all_backend",):
        "expert-parallel communication buffers (DeepEP and others) are GPU memory",
    ("enable_eplb", "eplb_config"): "redundant experts add expert weights per rank",
    ("enable_elastic_ep", "elastic_ep_max_dp_size"):
        "not analysed: elastic EP sizes the MoE layers for the largest DP size",
    ("enable_return_routed_experts",): "not analysed: may hold a GPU buffer per token",
    ("enable_hc_sp",): "not analysed: sequence parallelism of HyperConnection activations",
    ("enable_flashinfer_autotune",): "not analysed: warmup autotuning's memory",
    ("cpu_offload_gb", "cpu_offload_params", "offload_backend", "offload_group_size",
     "offload_num_in_group", "offload_prefetch_step", "offload_params"):
        "weights offloaded to host memory: fewer weight bytes per rank on the GPU",
    ("kv_offloading_size", "kv_offloading_backend"):
        "shorthands that configure vLLM's offloading connector; plan(kv_transfer_config=...) "
        "takes the connector, offload_config and capacity its options",
    ("ec_transfer_config", "ec_manager_config"):
        "not analysed: the encoder-cache connector's GPU memory",
    ("quantization_config",):
        "vLLM's online quantization, applied after loading (see check_quantization)",
    ("runner", "convert", "pooler_config"):
        "a pooling or converted model: which layers register a cache",
    ("model_impl", "model_class_overrides"):
        "another implementation or class of the model: its layers and weights",
    ("language_model_only", "mm_encoder_only"):
        "leaves out the language model or the encoders: layers and weights per rank",
    ("limit_mm_per_prompt", "skip_mm_profiling", "mm_processor_kwargs", "mm_ipc_gpu_memory_gb"):
        "the multimodal inputs profiled and buffered on the GPU: memory left to the cache",
    ("mm_encoder_tp_mode", "mm_encoder_attn_backend", "mm_encoder_attn_dtype",
     "mm_encoder_fp8_scale_path", "mm_encoder_fp8_scale_save_path",
     "mm_encoder_fp8_scale_save_margin"):
        "the vision encoder's sharding, kernels and quantization: its weights and activations",
    ("enable_lora", "max_loras", "max_lora_rank", "lora_dtype", "fully_sharded_loras",
     "lora_target_modules", "enable_tower_connector_lora", "specialize_active_lora",
     "enable_mixed_moe_lora_format", "enable_moe_shared_loras", "max_lora_cls_labels"):
        "LoRA slots are GPU weights per rank",
    ("spec_method", "spec_model", "spec_tokens"):
        "shorthands of speculative_config; plan(speculative_config=...) takes it whole",
    ("engram_config",): "not analysed: n-gram embedding storage on the GPU",
    ("diffusion_config",): "not analysed: diffusion models' settings",
})


__all__ = ["NOT_CACHE_ARGUMENTS", "PLANNED_AS", "UNPLANNED_CACHE_ARGUMENTS"]
