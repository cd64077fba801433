"""The model card's sharpgrpo parts: the paper each strategy implements and the config fields it reads (both declared
by the strategy class, ``paper`` and ``params``), BibTeX citations, and fixes to TRL's card for local models and
datasets."""

from __future__ import annotations

import os


def strategy_class(name: str):
    """The strategy class of a configured name (registered or a dotted path), or None if it cannot be found."""
    from sharpgrpo.strategies import STRATEGIES

    try:
        return STRATEGIES.get(name)
    except ValueError:
        return None


def strategy_paper(name: str):
    """The ``StrategyPaper`` a configured strategy declares, or None."""
    return getattr(strategy_class(name), "paper", None)


def _is_hub_id(name: str | None) -> bool:
    return bool(name) and name.count("/") == 1 and not os.path.exists(name) and not name.startswith((".", "/"))


def strategies_bibtex(strategies) -> str:
    """One ``@misc`` BibTeX entry per distinct paper of the named strategies (arXiv fields where known)."""
    entries, seen = [], set()
    for name in strategies:
        paper = strategy_paper(name)
        if paper is None or paper.title in seen:
            continue
        seen.add(paper.title)
        fields = [f"  title = {{{{{paper.title}}}}}", f"  note = {{{paper.citation}}}"]
        if paper.id:
            fields += [f"  eprint = {{{paper.id}}}", "  archivePrefix = {arXiv}"]
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
        fields = [f for f in getattr(strategy_class(name), "params", ()) if hasattr(args, f)]
        params = ", ".join(f"`{f}={getattr(args, f)!r}`" for f in fields)
        paper = strategy_paper(name)
        paper = paper.citation if paper is not None else "user-defined strategy"
        lines.append(f"- **`{name}`** ({params or 'no parameters'}). {paper}")
    lines += ["", f"Loss type `{args.loss_type}`, beta `{args.beta}`, "
              f"importance sampling level `{args.importance_sampling_level}`.", ""]
    return "\n".join(lines)


def write_model_card(trainer, parent_create_model_card, model_name=None, dataset_name=None, tags=None,
                     base_model: str | None = None) -> None:
    """TRL's model card (``parent_create_model_card``), plus a section naming the strategies, their parameters and
    papers.

    Before the Hub repository exists (``push_to_hub=False``, or offline) TRL's card says "None" for the model name
    and repository; here they default to ``hub_model_id`` (else the output folder's name), as TRL's own checkpoint
    cards do. ``base_model`` (e.g. ``train.py``'s ``model_name_or_path``) names the base model where TRL sees only a
    local folder; only hub ids are linked, and a local or registered dataset name is not linked to the Hub. The
    citation block holds BibTeX entries of the strategies' papers."""
    args = trainer.args
    if model_name is None:
        model_name = args.hub_model_id or os.path.basename(os.path.normpath(args.output_dir))
        model_name = model_name.split("/")[-1]
    created_repo_id = trainer.hub_model_id
    trainer.hub_model_id = created_repo_id or args.hub_model_id  # only for the card: push_to_hub still creates
    paper = trainer._paper
    trainer._paper = {**paper, "citation": strategies_bibtex(args.strategies) or paper.get("citation")}
    try:
        parent_create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
    finally:
        trainer.hub_model_id = created_repo_id
        trainer._paper = paper
    if not trainer.is_world_process_zero():
        return
    path = os.path.join(args.output_dir, "README.md")
    with open(path, encoding="utf-8") as card:
        text = card.read()
    repo_id = trainer.hub_model_id or args.hub_model_id
    text = fix_card_links(text, base_model or trainer.base_model_name, dataset_name, repo_id, args.output_dir)
    text = credit_every_paper(text, args.strategies)
    record = getattr(trainer, "run_record_path", None)  # written when training began (sharpgrpo.run.run_record)
    if record is not None and os.path.isfile(record):
        name = os.path.basename(record)
        text += (f"\n## Run record\n\n[`{name}`]({name}): the resolved config, command line, library versions, code "
                 "commit, machine and seeds of the run that trained this model.\n")
    with open(path, "w", encoding="utf-8") as card:
        card.write(text + "\n" + strategy_card_section(args))


def credit_every_paper(text: str, strategies) -> str:
    """TRL's card credits one paper ("a method introduced in [title](link)", the first strategy's): with several
    strategies of different papers, the sentence names each of them."""
    import re

    papers = list({p.title: p for p in map(strategy_paper, strategies) if p is not None}.values())
    if len(papers) < 2:
        return text
    links = [f"[{p.title}](https://huggingface.co/papers/{p.id})" if p.id else p.title for p in papers]
    credit = ", with methods introduced in " + ", ".join(links[:-1]) + " and " + links[-1]
    # TRL's sentence, with its one paper or without (TRL drops it when that paper has no arXiv id)
    pattern = (r"(This model was trained with [^\n]*?)(, a method introduced in \[[^\]]*\]"
               r"\(https://huggingface\.co/papers/[^)]*\))?\.(?=\s|$)")
    return re.sub(pattern, lambda match: match.group(1) + credit + ".", text, count=1)


def trl_paper(strategies, default: dict) -> dict:
    """TRL's ``_paper`` dict (title, id, citation) for the first configured strategy that declares a paper."""
    paper = next((p for p in map(strategy_paper, strategies) if p is not None), None)
    if paper is None:
        return default
    return {"title": paper.title, "citation": paper.citation, **({"id": paper.id} if paper.id else {})}
