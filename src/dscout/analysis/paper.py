"""The paper's reported numbers (docs/method.md §3, §7), for side-by-side columns labelled "paper".

Only numbers the paper states are here; nothing is interpolated.
"""

TABLE3 = {
    # target -> method label -> (speedup, MAT or None); six-benchmark average, T = 0, c = 1, SGLang on GPU
    "Qwen3-4B": {"DScout(32)": (3.84, 7.19), "DFlash(16)": (3.52, None), "EAGLE-3(60)": (1.92, None),
                 "PARD-2": (2.56, None)},
    "Qwen3-8B": {"DScout(32)": (4.14, 7.16), "DFlash(16)": (3.87, None), "EAGLE-3(60)": (2.39, None),
                 "PARD-2": (2.44, None)},
}
TABLE3_PER_TASK_QWEN3_8B = {
    ("gsm8k", "DScout(32)"): (5.65, 10.08), ("gsm8k", "DFlash(16)"): (5.01, 8.19),
    ("mt_bench", "DScout(16)"): (2.40, 3.89), ("mt_bench", "DScout(32)"): (2.34, None),
    ("mt_bench", "DFlash(16)"): (2.36, 3.71),
}
TABLE3_TEMPERATURE1_QWEN3_8B = {"DScout": 3.12, "DFlash(16)": 3.02}
TABLE1_MEAN_MAT_BS32 = {  # horizon set -> (without unmasking, with unmasking)
    "{4,8,16,32}": (6.228, 6.197),
    "{8,16,24,32}": (6.228, 6.263),
}
FIGURE4_INCREMENTS = [0.151, 0.155, 0.171, 0.491]  # cumulative recipe steps, Qwen3-8B 9t9d, bs 16
FIGURE4_TOTAL_GAIN = 0.161  # +16.1 % MAT over the DFlash recipe
DFLASH_FULL_BLOCK_SHARE_BS16 = 0.109  # DFlash at bs 16 accepts the whole block in 10.9 % of rounds
TABLE4 = {"DScout(best) range": (2.45, 4.14), "Llama-3.1-8B c=32": {"DScout(16)": 2.36, "DFlash(10)": 2.52,
                                                                   "DScout(best)": (2.59, 5.56)},
          "selection gain over DScout(16)": 0.0975}
DEPTH_PEAK = {"bs>=16": 6, "bs=8": 4}
