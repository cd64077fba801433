"""The model card's sharpgrpo parts: the paper each strategy implements (TRL's ``_paper`` convention), the config
fields each strategy reads, BibTeX citations, and fixes to TRL's card for local models and datasets."""

from __future__ import annotations

import os

# The paper each strategy implements, for the model card (TRL's `_paper` convention).
STRATEGY_PAPERS: dict[str, dict[str, str]] = {
    "grpo_sg": {
        "title": "Sharpness-Guided Group Relative Policy Optimization via Probability Shaping",
        "citation": "Tue Le, Linh Ngo Van, Trung Le. Sharpness-Guided Group Relative Policy Optimization via "
        "Probability Shaping (GRPO-SG; earlier version: Sharpness-Controlled GRPO with Token-Level Probability "
        "Shaping, TR-GRPO).",
    },
    "cw_grpo": {
        "title": "Taming Extreme Tokens: Covariance-Aware GRPO with Gaussian-Kernel Advantage Reweighting",
        "id": "2605.11538",
        "citation": "Cheng Wang, Qin Liu, Wenxuan Zhou, Muhao Chen. Taming Extreme Tokens: Covariance-Aware GRPO "
        "with Gaussian-Kernel Advantage Reweighting. arXiv:2605.11538.",
    },
    "thr": {
        "title": "Token Hidden Reward: Steering Exploration-Exploitation in Group Relative Deep Reinforcement "
        "Learning",
        "citation": "Token Hidden Reward: Steering Exploration-Exploitation in Group Relative Deep Reinforcement "
        "Learning (THR).",
    },
}
STRATEGY_PAPERS["reverse"] = STRATEGY_PAPERS["random"] = STRATEGY_PAPERS["equal"] = STRATEGY_PAPERS["grpo_sg"]
STRATEGY_PAPERS["nthr"] = STRATEGY_PAPERS["thr"]
STRATEGY_PAPERS["ar"] = {
    "title": "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs",
    "citation": "Yang et al. 2025, Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs (AR-Lopti).",
}
STRATEGY_PAPERS["passk_mixed"] = {
    "title": "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large Reasoning Models",
    "citation": "Chen et al. 2025, Pass@k Training for Adaptively Balancing Exploration and Exploitation.",
}
# The config fields each strategy reads (shown on the model card).
_SHAPING_FIELDS = ("sg_alpha", "sg_mu", "sg_tau", "sg_lower", "sg_upper", "weight_placement", "kl_weighting")
STRATEGY_FIELDS: dict[str, tuple[str, ...]] = {
    "grpo_sg": _SHAPING_FIELDS,
    "reverse": _SHAPING_FIELDS,
    "equal": ("weight_placement", "kl_weighting"),
    "random": ("random_weight_low", "random_weight_high", "random_weight_seed", "weight_placement", "kl_weighting"),
    "ar": ("ar_alpha",),
    "cw_grpo": ("cw_variant", "cw_weight_gradient", "cw_scope", "cw_advantage_mean", "cw_sigma_eps"),
    "thr": ("thr_p", "thr_beta", "thr_keep_below_threshold", "thr_entropy_quantile", "thr_vocab"),
    "nthr": ("thr_beta", "thr_vocab"),
    "passk_mixed": ("passk_k",),
}


def _is_hub_id(name: str | None) -> bool:
    return bool(name) and name.count("/") == 1 and not os.path.exists(name) and not name.startswith((".", "/"))


def strategies_bibtex(strategies) -> str:
    """One ``@misc`` BibTeX entry per distinct paper of the named strategies (arXiv fields where known)."""
    entries, seen = [], set()
    for name in strategies:
        paper = STRATEGY_PAPERS.get(name)
        if paper is None or paper["title"] in seen:
            continue
        seen.add(paper["title"])
        fields = [f"  title = {{{{{paper['title']}}}}}", f"  note = {{{paper['citation']}}}"]
        if "id" in paper:
            fields += [f"  eprint = {{{paper['id']}}}", "  archivePrefix = {arXiv}"]
        entries.append(f"@misc{{sharpgrpo_{name},\n" + ",\n".join(fields) + "\n}")
    return "\n\n".join(entries)


def fix_card_links(text: str, base_model, dataset_name, hub_model_id, output_dir) -> str:
    """Replace TRL's "None" base model and repository and its Hub link for a dataset that is not on the Hub."""
    base = f"[{base_model}](https://huggingface.co/{base_model})" if _is_hub_id(base_model) else f"`{base_model}`"
    if base_model:
        text = text.replace("[None](https://huggingface.co/None)", base)
        if _is_hub_id(base_model):
            text = text.replace("model_name: ", f"base_model: {base_model}\nmodel_name: ", 1)
    else:
        text = text.replace("a fine-tuned version of [None](https://huggingface.co/None)", "a fine-tuned model")
    if dataset_name and not _is_hub_id(dataset_name):
        text = text.replace(f"[{dataset_name}](https://huggingface.co/datasets/{dataset_name}) dataset",
                            f"`{dataset_name}` dataset")  # fmt: skip
        text = text.replace(f"datasets: {dataset_name}\n", "")
    if not hub_model_id:
        local = output_dir if not os.path.isabs(output_dir) else os.path.basename(os.path.normpath(output_dir))
        text = text.replace('model="None"', f'model="{local}"')
    return text


def strategy_card_section(args) -> str:
    """Markdown: each configured strategy with its parameters and the paper it implements."""
    lines = ["## sharpgrpo strategies", ""]
    for name in args.strategies:
        fields = [f for f in STRATEGY_FIELDS.get(name, ()) if hasattr(args, f)]
        params = ", ".join(f"`{f}={getattr(args, f)!r}`" for f in fields)
        paper = STRATEGY_PAPERS.get(name, {}).get("citation", "user-defined strategy")
        lines.append(f"- **`{name}`** ({params or 'no parameters'}). {paper}")
    lines += ["", f"Loss type `{args.loss_type}`, beta `{args.beta}`, "
              f"importance sampling level `{args.importance_sampling_level}`.", ""]
    return "\n".join(lines)
