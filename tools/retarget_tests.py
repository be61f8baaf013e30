"""Where each test went when tests/ came to mirror the packages (issue 45): old node id -> new.

Branches written against the flat layout name tests by their old paths (tools/mutants.toml,
docs, commands in notes). This maps them:

    python tools/retarget_tests.py tests/test_wrong_answers.py::test_fp8_values_are_decoded
    python tools/retarget_tests.py --rewrite tools/mutants.toml docs/compile.md

An id or path with no entry here is left as it is (`--check` lists the old ones it finds).
Whole files moved with `git mv`; the files in SPLIT were split by test, each test keeping its name.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# old file -> new file (every test in it moved along, same names)
FILES: dict[str, str] = {
    "tests/test_amplification_unknown_inputs.py": "tests/compare/test_judge.py",
    "tests/test_argcodec.py": "tests/dumpfile/test_argcodec.py",
    "tests/test_backends.py": "tests/device_backend/test_registry.py",
    "tests/test_bench_cluster.py": "tests/benchmarks/test_bench_cluster.py",
    "tests/test_browser.py": "tests/server/routers/test_ui_browser.py",
    "tests/test_cancelling_sums.py": "tests/compare/test_numerics_cancellation.py",
    "tests/test_compare.py": "tests/compare/test_api.py",
    "tests/test_compare_blas.py": "tests/compare/test_blas.py",
    "tests/test_compare_checks.py": "tests/compare/test_checks.py",
    "tests/test_compare_fastpath.py": "tests/compare/test_engine.py",
    "tests/test_compare_metrics.py": "tests/compare/test_metrics.py",
    "tests/test_compare_notorch.py": "tests/compare/test_cli_without_torch.py",
    "tests/test_compare_random_draws.py": "tests/compare/test_draws.py",
    "tests/test_compare_runner.py": "tests/compare/test_api_runner.py",
    "tests/test_compiled_batchnorm.py": "tests/dumper/compiled/test_source_batchnorm.py",
    "tests/test_compiled_bert.py": "tests/dumper/compiled/test_source_bert.py",
    "tests/test_compiled_cache.py": "tests/dumper/compiled/test_codegen_cache.py",
    "tests/test_compiled_dropout.py": "tests/dumper/compiled/test_source_dropout.py",
    "tests/test_compiled_dumper_guards.py": "tests/dumper/test_scope_compiled_guards.py",
    "tests/test_compiled_dynamic.py": "tests/dumper/compiled/test_source_dynamic.py",
    "tests/test_compiled_gpt2.py": "tests/dumper/compiled/test_source_gpt2.py",
    "tests/test_compiled_inductor.py": "tests/dumper/compiled/test_source.py",
    "tests/test_compiled_inplace.py": "tests/dumper/compiled/test_source_inplace.py",
    "tests/test_compiled_llama.py": "tests/dumper/compiled/test_source_llama.py",
    "tests/test_compiled_names.py": "tests/dumper/compiled/test_names.py",
    "tests/test_compiled_overflow.py": "tests/dumper/compiled/test_source_overflow.py",
    "tests/test_compiled_pairing.py": "tests/compare/test_compiled_align.py",
    "tests/test_compiled_recompile.py": "tests/dumper/compiled/test_watch_recompile.py",
    "tests/test_compiled_replay_judge.py": "tests/dumper/compiled/test_reference.py",
    "tests/test_compiled_watch.py": "tests/dumper/compiled/test_watch.py",
    "tests/test_compute_precision.py": "tests/compare/test_precision.py",
    "tests/test_content_hash.py": "tests/dumpfile/test_checksum.py",
    "tests/test_corruption_fuzz.py": "tests/dumpfile/test_validate_fuzz.py",
    "tests/test_cppext.py": "tests/native/test_cppext.py",
    "tests/test_cuda.py": "tests/device_backend/test_builtin_cuda.py",
    "tests/test_debugger.py": "tests/debugger/test_core.py",
    "tests/test_deferred_stats.py": "tests/dumper/test_deferred_stats.py",
    "tests/test_demo.py": "tests/scenarios/test_demo.py",
    "tests/test_dump_never_code.py": "tests/scenarios/test_hostile_dumps_never_run.py",
    "tests/test_dump_space_held.py": "tests/dumpfile/test_reserve.py",
    "tests/test_dumper.py": "tests/dumper/test_core.py",
    "tests/test_dumper_never_kills.py": "tests/dumper/test_core_never_kills.py",
    "tests/test_emulated_replay.py": "tests/replay/test_emulate.py",
    "tests/test_fp8.py": "tests/device_backend/test_formats.py",
    "tests/test_fused_optimizers.py": "tests/dumper/test_recorder_fused_optimizers.py",
    "tests/test_higher_order_ops.py": "tests/test_hops.py",
    "tests/test_hostile_inputs.py": "tests/scenarios/test_hostile_inputs.py",
    "tests/test_import_circles.py": "tests/structure/test_import_circles.py",
    "tests/test_integrations.py": "tests/scenarios/test_trainer_and_lightning_ranks.py",
    "tests/test_layering.py": "tests/structure/test_layering.py",
    "tests/test_live.py": "tests/live/test_check.py",
    "tests/test_live_uninit.py": "tests/live/test_check_uninit.py",
    "tests/test_monitor.py": "tests/monitor/test_core.py",
    "tests/test_monitor_capture_nonfinite.py": "tests/monitor/test_capture.py",
    "tests/test_monitor_fuzz.py": "tests/monitor/test_series_fuzz.py",
    "tests/test_monitor_hf.py": "tests/monitor/test_hf.py",
    "tests/test_monitor_lightning.py": "tests/monitor/test_lightning.py",
    "tests/test_monitor_plot.py": "tests/monitor/test_plot.py",
    "tests/test_monitor_ranks.py": "tests/monitor/test_core_ranks.py",
    "tests/test_multirank.py": "tests/scenarios/test_multirank.py",
    "tests/test_mutate_tool.py": "tests/tools/test_mutate.py",
    "tests/test_native.py": "tests/native/test_native.py",
    "tests/test_nonregular_files.py": "tests/dumpfile/test_reader_nonregular.py",
    "tests/test_out_buffers.py": "tests/dumper/test_recorder.py",
    "tests/test_overflow.py": "tests/overflow/test_scan.py",
    "tests/test_overflow_contained.py": "tests/overflow/test_scan_contained.py",
    "tests/test_overflow_masks.py": "tests/overflow/test_scan_masks.py",
    "tests/test_overflow_offline_masks.py": "tests/overflow/test_scan_statistics_dumps.py",
    "tests/test_rank_labels.py": "tests/compare/test_multirank.py",
    "tests/test_reduction_lengths.py": "tests/compare/test_numerics.py",
    "tests/test_reliability.py": "tests/dumpfile/test_writer_reliability.py",
    "tests/test_replay.py": "tests/replay/test_engine.py",
    "tests/test_replay_cluster_reads.py": "tests/replay/test_cluster.py",
    "tests/test_replay_metrics.py": "tests/replay/test_metrics.py",
    "tests/test_replay_proof.py": "tests/replay/test_engine_proof.py",
    "tests/test_replay_reads.py": "tests/replay/test_engine_reads.py",
    "tests/test_replay_source.py": "tests/replay/test_engine_source.py",
    "tests/test_rnn_kernels.py": "tests/replay/test_rnn.py",
    "tests/test_security_files.py": "tests/scenarios/test_crafted_dump_files.py",
    "tests/test_server.py": "tests/server/test_app.py",
    "tests/test_server_cluster.py": "tests/server/test_jobcluster.py",
    "tests/test_server_concurrency.py": "tests/server/test_app_concurrency.py",
    "tests/test_server_db_values.py": "tests/server/test_db.py",
    "tests/test_server_exports.py": "tests/server/test_exports.py",
    "tests/test_server_fastrows.py": "tests/server/test_fastrows.py",
    "tests/test_server_fuzz.py": "tests/server/test_app_fuzz.py",
    "tests/test_server_isolated.py": "tests/server/test_isolated.py",
    "tests/test_server_limits.py": "tests/server/test_app_limits.py",
    "tests/test_server_rowindex.py": "tests/server/test_reportindex.py",
    "tests/test_server_security.py": "tests/server/test_guard.py",
    "tests/test_server_shared_db.py": "tests/server/test_db_shared.py",
    "tests/test_server_ui.py": "tests/server/routers/test_ui.py",
    "tests/test_sim.py": "tests/device_backend/test_simulator.py",
    "tests/test_sim_narrow_profiles.py": "tests/device_backend/test_simulator_narrow_profiles.py",
    "tests/test_stats_paths.py": "tests/dumpfile/test_stats.py",
    "tests/test_subclass_blind.py": "tests/dumper/test_subclass_watch.py",
    "tests/test_suspects_selection.py": "tests/compare/test_suspects.py",
    "tests/test_symsizes.py": "tests/dumpfile/test_symsizes.py",
    "tests/test_tensor_staging.py": "tests/dumpfile/test_staging.py",
    "tests/test_testdevice.py": "tests/testdevice/test_testdevice.py",
    "tests/test_upload_limits.py": "tests/server/test_uploads.py",
    "tests/test_verdicts.py": "tests/scenarios/test_verdicts_on_trial_models.py",
    "tests/test_wrong_answers.py": "tests/scenarios/test_values_users_act_on.py",
    # helpers: one package, imported as tests._support.<name>
    "tests/_cluster_tasks.py": "tests/_support/cluster_tasks.py",
    "tests/_crafted.py": "tests/_support/crafted.py",
    "tests/_hostile_kernels.py": "tests/_support/hostile_kernels.py",
    "tests/_integration_worker.py": "tests/_support/integration_worker.py",
    "tests/_kill_runner.py": "tests/_support/kill_runner.py",
    "tests/_lm_dumps.py": "tests/_support/lm_dumps.py",
    "tests/_miscompile.py": "tests/_support/miscompile.py",
    "tests/_multirank_worker.py": "tests/_support/multirank_worker.py",
    "tests/_native.py": "tests/_support/native.py",
    "tests/_postgres.py": "tests/_support/postgres.py",
    "tests/_ranks.py": "tests/_support/ranks.py",
    "tests/_schema_start.py": "tests/_support/schema_start.py",
    "tests/_server_data.py": "tests/_support/server_data.py",
}

# files split by test: old file -> {test name -> new file}
SPLIT: dict[str, dict[str, str]] = {
    "tests/test_conventions.py": {
        "test_docs_guide_snippets_run_as_written": "tests/scenarios/test_ascend_guide.py",
        "test_guide_torch_utils_dumper_snippet_runs_as_written":
            "tests/scenarios/test_ascend_guide.py",
        "test_extracted_ops_are_valid_load_files": "tests/scenarios/test_ascend_guide.py",
        "test_use_dump_false_records_nothing": "tests/dumper/test_guide_args.py",
        "test_folder_dump_path_gets_dump_rank_file": "tests/dumper/test_guide_args.py",
        "test_a_new_path_without_suffix_is_a_folder": "tests/dumper/test_guide_args.py",
        "test_empty_or_none_load_file_path_means_no_load": "tests/dumper/test_guide_args.py",
        "test_use_load_needs_a_load_file": "tests/dumper/test_guide_args.py",
        "test_load_with_acl_dump_is_refused_in_one_line": "tests/dumper/test_guide_args.py",
        "test_load_file_with_soft_link_is_refused": "tests/dumper/test_golden_feed.py",
        "test_compare_accepts_out_and_writes_msprobe_columns": "tests/compare/test_writers.py",
        "test_msaccucmp_convert_flags_on_a_folder_of_dumps": "tests/dumpfile/test_convert.py",
        "test_convert_writes_one_npy_per_tensor_with_an_index": "tests/dumpfile/test_convert.py",
        "test_convert_filters_by_op_seq_module": "tests/dumpfile/test_convert.py",
        "test_convert_never_writes_outside_its_folder": "tests/dumpfile/test_convert.py",
        "test_convert_does_not_follow_a_planted_symlink": "tests/dumpfile/test_convert.py",
        "test_closed_pipe_ends_quietly": "tests/test_cli_errors.py",
        "test_serve_names_the_missing_run_file": "tests/test_cli_errors.py",
        "test_compare_to_an_existing_file_says_so": "tests/test_cli_errors.py",
        "test_op_patterns_take_the_names_users_type": "tests/test_patterns.py",
    },
    "tests/test_training_features.py": {
        "test_adamw_step_is_recorded_as_the_optimizer_phase": "tests/dumper/test_core_training.py",
        "test_cpu_bf16_autocast_records_the_dtypes_that_ran": "tests/dumper/test_core_training.py",
        "test_inference_mode_tensors_are_recorded": "tests/dumper/test_core_training.py",
        "test_activation_checkpointing_records_the_recomputation":
            "tests/dumper/test_core_training.py",
        "test_custom_autograd_function_forward_and_backward": "tests/dumper/test_core_training.py",
        "test_max_pending_bytes_blocks_the_training_thread": "tests/dumpfile/test_staging.py",
        "test_transformers_gpt2_dump_compare_and_culprit":
            "tests/scenarios/test_stranger_models.py",
    },
    "tests/test_dist_stacks.py": {
        "test_views_of_an_empty_buffer_are_not_data_until_a_copy_fills_them":
            "tests/dumper/test_uninit.py",
        "test_a_parameter_filled_by_its_initialiser_is_data": "tests/dumper/test_uninit.py",
        "test_partly_filled_outputs_are_a_registry_fact_users_extend": "tests/test_aten.py",
        "test_a_different_scalar_argument_is_reported_with_both_values_never_pass":
            "tests/compare/test_arguments.py",
        "test_gradscaler_unscale_and_update_are_optimizer_phase": "tests/dumper/test_scope.py",
        "test_diverged_first_is_where_a_rank_kernel_fault_starts_not_where_error_grows":
            "tests/compare/test_multirank.py",
    },
}

_ID = re.compile(r"tests/[A-Za-z0-9_/]*\.py(?:::[A-Za-z0-9_]+)?")


def retarget(node: str) -> str:
    """The new id of `node` (`path` or `path::name[...]`); `node` itself when nothing moved."""
    path, sep, rest = node.partition("::")
    if path in FILES:
        return FILES[path] + sep + rest
    if path in SPLIT and sep:
        name = re.split(r"[\[:]", rest, maxsplit=1)[0]
        if name in SPLIT[path]:
            return SPLIT[path][name] + sep + rest
    return node


def rewrite(text: str) -> str:
    """Every old test path or node id in `text` replaced by its new one."""
    return _ID.sub(lambda m: retarget(m.group(0)), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", help="old node ids or paths to print the new ones of")
    ap.add_argument("--rewrite", nargs="+", metavar="FILE", default=[],
                    help="rewrite the ids and paths in these files in place")
    ap.add_argument("--check", nargs="+", metavar="FILE", default=[],
                    help="list old ids and paths still in these files (exit 1 if any)")
    args = ap.parse_args(argv)
    for node in args.ids:
        print(retarget(node))
    for name in args.rewrite:
        p = Path(name)
        text = p.read_text()
        new = rewrite(text)
        if new != text:
            p.write_text(new)
            print(f"{name}: rewritten", file=sys.stderr)
    stale = []
    for name in args.check:
        for m in _ID.finditer(Path(name).read_text()):
            path = m.group(0).partition("::")[0]
            if path in FILES or path in SPLIT:
                stale.append(f"{name}: {m.group(0)}")
    for line in stale:
        print(line)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
