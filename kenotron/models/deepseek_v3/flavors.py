"""Named sizes of DeepSeek-V3-class models.

`671B` is DeepSeek-V3's published config.json (deepseek-ai/DeepSeek-V3); `16B` is torchtitan
0.2.2's deepseek_v3 16B flavor (DeepSeek-V2-Lite's shapes: softmax routing without
renormalization, no query low rank, 2 shared experts); `moonlight` is Moonlight-16B-A3B's
config.json and `kimi-k2` Kimi K2's (both published as model_type deepseek_v3, one expert
group). `debug` is kenotron's own, sized to the built-in 4096-token vocabulary with every
feature on (query low rank, expert groups, YaRN), small enough to train on a CPU in a minute.
"""

from __future__ import annotations

from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.common.rope_scaling import YarnScaling
from kenotron.models.deepseek_v3.args import DeepSeekV3Args

DEEPSEEK_V3_FLAVORS: dict[str, DeepSeekV3Args] = {
    "debug": DeepSeekV3Args(
        dim=256, n_layers=4, n_heads=8, q_rank=128, kv_rank=64, nope_dim=32, rope_dim=16, v_dim=32, ffn_dim=512,
        n_dense_layers=1, vocab_size=4096, max_seq_len=2048,
        moe=MoEArgs(n_experts=8, top_k=2, ffn_dim=128, score_func="sigmoid", norm_topk=True, route_scale=2.5,
                    shared_ffn_dim=128, n_groups=4, topk_groups=2),
        rope_scaling=YarnScaling(factor=4.0, original_max_len=512, mscale=1.0, mscale_all_dim=1.0),
    ),
    "16B": DeepSeekV3Args(
        dim=2048, n_layers=27, n_heads=16, q_rank=0, kv_rank=512, nope_dim=128, rope_dim=64, v_dim=128,
        ffn_dim=10944, n_dense_layers=1, vocab_size=102400,
        moe=MoEArgs(n_experts=64, top_k=6, ffn_dim=1408, score_func="softmax", norm_topk=False, route_scale=1.0,
                    shared_ffn_dim=2 * 1408),
    ),
    "moonlight": DeepSeekV3Args(
        dim=2048, n_layers=27, n_heads=16, q_rank=0, kv_rank=512, nope_dim=128, rope_dim=64, v_dim=128,
        ffn_dim=11264, n_dense_layers=1, vocab_size=163840, norm_eps=1e-5, rope_theta=50000.0, max_seq_len=8192,
        moe=MoEArgs(n_experts=64, top_k=6, ffn_dim=1408, score_func="sigmoid", norm_topk=True, route_scale=2.446,
                    shared_ffn_dim=2 * 1408),
    ),
    "671B": DeepSeekV3Args(
        max_seq_len=163840,
        rope_scaling=YarnScaling(factor=40.0, original_max_len=4096, beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                                 mscale_all_dim=1.0),
        mtp_depth=1,
    ),
    "kimi-k2": DeepSeekV3Args(
        n_heads=64, n_dense_layers=1, vocab_size=163840, rope_theta=50000.0, max_seq_len=131072,
        moe=MoEArgs(n_experts=384, top_k=8, ffn_dim=2048, score_func="sigmoid", norm_topk=True, route_scale=2.827,
                    shared_ffn_dim=2048),
        rope_scaling=YarnScaling(factor=32.0, original_max_len=4096, beta_fast=1.0, beta_slow=1.0, mscale=1.0,
                                 mscale_all_dim=1.0),
    ),
}
