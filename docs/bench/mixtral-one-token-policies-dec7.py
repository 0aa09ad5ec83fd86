#!/usr/bin/env python3
# Record of an experiment (Dec 7 2026), not a tool: what an online replacement rule could win over lru on the recorded
# Mixtral routing at a 25% budget, where the budget is exactly one token's working set (64 of 256 experts, 2 of 8 per
# layer) and every layer must hold its two current experts while it computes. Replays both recorded traces as
# guanaco-sim does (token-major, layer-minor, sequences back to back) and counts hits per expert access.
#   python3 mixtral-one-token-policies-dec7.py shared/traces/mixtral-8x7b/{humaneval,gsm8k}_2_routing.jsonl
import bisect, collections, json, sys

N_LAYER, N_EXPERT, CAPACITY = 32, 8, 64

def load(paths):
    accesses = []
    for path in paths:
        sequences = collections.OrderedDict()
        for line in open(path):
            r = json.loads(line)
            sequences.setdefault((r["dataset"], r["problem_id"]), {}).setdefault(r["token_idx"], {})[r["layer"]] = r["experts"]
        for tokens in sequences.values():
            for t in sorted(tokens):
                for layer in sorted(tokens[t]):
                    accesses.append((layer, tuple(sorted(set(tokens[t][layer])))))
    return accesses

accesses = load(sys.argv[1:])
uses = collections.defaultdict(list)
for i, (layer, need) in enumerate(accesses):
    for e in need:
        uses[(layer, e)].append(i)

def next_use(i, key):
    p = uses[key]
    k = bisect.bisect_right(p, i)
    return p[k] if k < len(p) else 1 << 60

def replay(score):
    """score(i, layer, key, state) -> larger leaves first; state['last'][key] = token of last use."""
    resident, hits, total, state = set(), 0, 0, {"last": {}, "last_access": {}, "token": 0, "freq": {}, "pairs": {}, "prev": None}
    for i, (layer, need) in enumerate(accesses):
        if layer == 0 and i:
            state["token"] += 1
        total += len(need)
        hits += sum((layer, e) in resident for e in need)
        resident.update((layer, e) for e in need)
        while len(resident) > CAPACITY:
            candidates = [k for k in resident if not (k[0] == layer and k[1] in need)]
            resident.discard(max(candidates, key=lambda k: score(i, layer, k, state)))
        for e in need:
            f, at = state["freq"].get((layer, e), (0.0, 0))
            state["freq"][(layer, e)] = (f * 0.5 ** ((state["token"] - at) / 16) + 1, state["token"])
            state["last"][(layer, e)] = state["token"]
            state["last_access"][(layer, e)] = i
        prev = state["prev"]
        if prev and prev[0] == layer - 1:
            for a in prev[1]:
                state["pairs"][(layer - 1, a, None)] = state["pairs"].get((layer - 1, a, None), 0) + 1
                for e in need:
                    state["pairs"][(layer - 1, a, e)] = state["pairs"].get((layer - 1, a, e), 0) + 1
        state["prev"] = (layer, need)
    return 100.0 * hits / total

def layer_distance(layer, key):
    return (key[0] - layer) % N_LAYER or N_LAYER

def p_frequency(key, state):
    f, at = state["freq"].get(key, (0.0, 0))
    return max(f * 0.5 ** ((state["token"] - at) / 16) / 16 * 0.69, 1e-6)  # decayed uses per token, half-life 16

def p_pilot(i, layer, key, state):  # the next layer's experts: how often they followed this layer's current pair
    if key[0] == layer + 1:
        need = accesses[i][1]
        num = sum(state["pairs"].get((layer, a, key[1]), 0) for a in need)
        den = sum(state["pairs"].get((layer, a, None), 0) for a in need)
        return (num + 0.25) / (den + 1.0)
    return 0.37 if state["last"].get(key, -9) >= state["token"] - 1 else 0.16  # repeat rate against the rest

rules = {
    "lru (what every policy here does at one token's working set)": lambda i, l, k, s: -s["last_access"].get(k, -1),
    "belady (the future known)": lambda i, l, k, s: next_use(i, k),
    "least likely first (decayed frequency, half-life 16 tokens)": lambda i, l, k, s: -p_frequency(k, s),
    "longest expected wait first (frequency and layer distance)": lambda i, l, k, s: layer_distance(l, k) + N_LAYER * (1 / min(p_frequency(k, s), 1) - 1),
    "pilot for the next layer, repeat rate for the rest, per layer distance": lambda i, l, k, s: -p_pilot(i, l, k, s) / layer_distance(l, k),
    "the next layer's routing known exactly (an ideal pilot or gate), repeat rate for the rest": lambda i, l, k, s: -(
        float(next_use(i, k) <= i + 1) if k[0] == l + 1 else 0.37 if s["last"].get(k, -9) >= s["token"] - 1 else 0.16
    ) / layer_distance(l, k),
    "one token of the future known (an ideal next-token predictor)": lambda i, l, k, s: (
        (1, layer_distance(l, k)) if next_use(i, k) > i + layer_distance(l, k) else (0, -layer_distance(l, k))),
}
for name, rule in rules.items():
    print(f"{replay(rule):6.2f}% hits  {name}")
