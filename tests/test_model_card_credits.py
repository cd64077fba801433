"""The model card credits the paper of every configured strategy, not only the first one's (TRL's card sentence
names one paper)."""

from sharpgrpo.training.model_card import credit_every_paper, strategy_paper

TRL_SENTENCE = ("This model was trained with GRPO, a method introduced in [{title}](https://huggingface.co/papers/{id}).")


def test_every_strategys_paper_is_credited():
    first = strategy_paper("grpo_sg")
    text = "# card\n\n" + TRL_SENTENCE.format(title=first.title, id=first.id) + "\n"
    strategies = ["grpo_sg", "cw_grpo", "thr"]
    papers = [strategy_paper(name) for name in strategies]
    assert len({p.title for p in papers}) == 3
    credited = credit_every_paper(text, strategies)
    for paper in papers:
        assert paper.title in credited
        if paper.id:
            assert f"https://huggingface.co/papers/{paper.id}" in credited
    assert "a method introduced in" not in credited and "with methods introduced in" in credited
    assert credit_every_paper(text, ["grpo_sg"]) == text  # one paper: TRL's sentence stands
    assert credit_every_paper(text, ["grpo_sg", "equal"]) == text  # `equal`: the same paper's ablation
    # TRL leaves out its sentence's paper when the first one has no arXiv id: the credit is added all the same
    bare = "# card\n\nThis model was trained with GRPO.\n"
    added = credit_every_paper(bare, strategies)
    assert all(paper.title in added for paper in papers) and added.count("This model was trained with GRPO") == 1
