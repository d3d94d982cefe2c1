# SPDX-License-Identifier: Apache-2.0
"""Format a bench result as the table ``vla-policy-bench`` prints (``table``; ``dds_table`` for ``--dds``)."""

from __future__ import annotations

from vla_policy_node.bench.measure import STAGES


def dds_table(result: dict) -> str:
    c, r = result["config"], result["dds"]
    head = (f"vla-policy-bench --dds: {c['name']}, {c['cameras']} camera(s) {c['camera_frame_hw']}, {c['dtype']}"
            + (", compiled" if r.get("compile") else ""))
    if "frame_to_command" not in r:
        return f"{head}\nnot measured: {r.get('reason', 'no command received')}"
    f = r["frame_to_command"]
    return (f"{head}, node at {r['control_rate_hz']:.0f} Hz, ROS_DOMAIN_ID {r['domain_id']}, localhost only\n"
            f"frame -> command: median {f['median_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms, "
            f"max {f['max_ms']:.1f} ms ({f['n']} episodes; {r['frames_without_command_within_a_period']} "
            f"camera periods passed with no command)\n"
            f"node observation -> chunk p50 {r['node_total_p50_ms']:.1f} ms; "
            f"ROS overhead {r['ros_overhead_ms']:.1f} ms "
            f"(target < {r['target_ms']:.1f} ms = 5% of the policy time + 2 ms)")


def table(result: dict) -> str:
    c, m, s = result["config"], result["memory"], result["stages"]
    lines = [f"vla-policy-bench: {c['name']} ({c['family']}, {c['params_m']:.1f} M params), {c['cameras']} camera(s), "
             f"batch {c['batch']}, '{c['padding']}' padding ({c['prompt_tokens']} prompt tokens, "
             f"{c['prompt_tokens_used']} used), "
             f"{c['device']} {c['dtype']}, {c['threads']} threads ({c['threads_used']} used), "
             f"{c['prefix_tokens']} prefix tokens, "
             f"{c['num_steps']} steps, chunk {c['chunk_size']}, {c['iters']} iterations after {c['warmup']} warm-up",
             *(report for report in (c["compile_report"], c["threads_report"], c.get("trace_report")) if report),
             *([f"eager chunks replayed from {c['traced']} traces (--trace)"] if c.get("traced") else []),
             f"{'stage':<22}{'median ms':>12}{'p95 ms':>12}{'max ms':>12}"]
    names = {"denoise_step": "denoise step (each)", "denoise": f"denoise ({c['num_steps']} steps)"}
    for stage in STAGES:
        st = s[stage]
        lines.append(f"{names.get(stage, stage):<22}{st['median_ms']:>12.2f}{st['p95_ms']:>12.2f}{st['max_ms']:>12.2f}")
    mem = (f"peak RSS {m['peak_rss_mib']:.0f} MiB over the {m['peak_counted_from']} (RSS {m['rss_start_mib']:.0f} -> "
           f"{m['rss_end_mib']:.0f} MiB; {m['peak_rss_load_mib']:.0f} MiB while loading, mapped weights file included)")
    if m["cuda_peak_mib"] is not None:
        mem += f", CUDA peak {m['cuda_peak_mib']:.0f} MiB"
    lines.append(mem)
    held = f"weights held {m['weights_mib'] / 1024:.2f} GiB + oneDNN-packed copies {m['packed_mib'] / 1024:.2f} GiB"
    est = m.get("estimate")
    if est:
        held += (f" (estimated {est['weights_gib']:.2f} + {est['packed_gib']:.2f} GiB; "
                 f"estimated host peak {est['host_peak_gib']:.1f} GiB)")
    lines.append(held)
    saved = c.get("checkpoint")
    if saved:
        lines.append(f"random checkpoint: {saved['params_in_file'] / 1e6:.1f} M params in the file, {saved['dtype']}, "
                     f"{saved['file_bytes'] / 2**30:.2f} GiB; build + init {saved['build_s']:.1f} s, "
                     f"save {saved['save_s']:.1f} s; load_policy {c['load_s']:.1f} s")
    else:
        lines.append(f"load_policy {c['load_s']:.1f} s")
    n = result["naive"]
    if n:
        lines.append(f"naive path (prefix every step): {n['naive']['median_ms']:.1f} ms vs cached "
                     f"{n['cached']['median_ms']:.1f} ms -> ratio {n['ratio']:.2f} "
                     f"(theoretical {n['theoretical_ratio']:.2f} "
                     f"from FLOPs, {n['expected_ratio_from_stage_medians']:.2f} from stage medians); "
                     f"max |diff| {n['max_abs_diff']:.1e}")
    fl = result.get("flops")
    if fl:
        pk = fl["peak_measured"]
        lines.append(f"matmul FLOPs per chunk {fl['gflops']['chunk']:.1f} G (prefix {fl['gflops']['prefix']:.1f} G + "
                     f"{c['num_steps']} x {fl['gflops']['step']:.2f} G); float32 peak {fl['peak_gflops']:.0f} GFLOP/s "
                     f"({pk['threads']} threads, best matmul) -> ours {100 * fl['ours_fraction']:.1f}% of it"
                     + (f", LeRobot {100 * fl['lerobot_fraction']:.1f}%" if "lerobot_fraction" in fl else ""))
        if "int8_peak" in fl:
            ip = fl["int8_peak"]
            lines.append(f"int8 matmul peak {ip['peak']:.0f} GOPS (the faster of fbgemm and oneDNN)"
                         + (f", bfloat16 {ip['bfloat16']:.0f} GFLOP/s" if "bfloat16" in ip else "")
                         + f" -> ours {100 * fl['ours_fraction_of_int8_peak']:.1f}% of the int8 peak")
    lr = result["lerobot"]
    if lr.get("available") and "speedup" in lr:
        lines.append(f"LeRobot {lr['torch']} predict_action_chunk (float32): median {lr['median_ms']:.1f} ms, "
                     f"p95 {lr['p95_ms']:.1f} ms -> ours is {lr['speedup']:.2f}x faster (paired median; "
                     f"{lr['speedup_of_medians']:.2f}x of medians); max |action diff| {lr['max_abs_diff']:.1e}, "
                     f"peak RSS {lr['peak_rss_mib']:.0f} MiB")
        pl = lr["pipeline"]
        lines.append(f"LeRobot pre-processor + predict_action_chunk + post-processor: median {pl['median_ms']:.1f} ms "
                     f"-> ours is {lr['pipeline_speedup']:.2f}x faster (paired median, same raw observation); "
                     f"max |action diff| {lr['pipeline_max_abs_diff']:.1e}")
    else:
        lines.append(f"LeRobot: not measured: {lr.get('reason', 'no iterations')}")
    return "\n".join(lines)
