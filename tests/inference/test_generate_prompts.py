"""`jaxcore generate`'s prompts (issue 51): a conversation in a prompts file is rendered with the chat template, as
training renders one (before: "missing string field 'prompt'"), and `--system` without `--chat-template`, which
nothing read, is one line (before: silently ignored)."""

from __future__ import annotations

import json

from tests.cli_runs import run_cli


def generated(capsys, model, *args):
    capsys.readouterr()
    from jaxcore.cli import main

    code = main(["generate", "--model", str(model), "--max-new-tokens", "4", "--temperature", "0", *map(str, args)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return [json.loads(line) for line in captured.out.splitlines()]


def test_a_conversation_in_a_prompts_file_is_rendered_with_the_chat_template(tiny_dir, tmp_path, capsys):
    model = tiny_dir("llama")
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": conversation}) + "\n" + json.dumps({"prompt": "hi"}) + "\n")
    rows = generated(capsys, model, "--prompts-file", prompts)
    templated = generated(capsys, model, "--chat-template", "--system", "Be brief.", "--prompt", "hi")
    assert rows[0]["prompt"] == conversation and rows[0]["completion"] == templated[0]["completion"]
    plain = generated(capsys, model, "--chat-template", "--prompt", "hi")
    assert rows[1]["completion"] == plain[0]["completion"]           # the string is a user turn, as in training


def test_a_malformed_conversation_names_its_message(tiny_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    for prompt, message in [([{"role": "user"}], "field 'prompt': message 0 is not a {'role': str, 'content': str}"),
                            ([], "field 'prompt': an empty conversation"),
                            (7, "missing field 'prompt' (a string, or a conversation")]:
        prompts.write_text(json.dumps({"prompt": prompt}) + "\n")
        code, err = run_cli(capsys, "generate", "--model", tiny_dir("llama"), "--prompts-file", prompts)
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"jaxcore generate: error: {prompts}:1: ") and message in err[0], err


def test_system_without_chat_template_is_one_line(tiny_dir, capsys):
    code, err = run_cli(capsys, "generate", "--model", tiny_dir("llama"), "--prompt", "hi", "--system", "Be brief.")
    assert code == 2 and err == ["jaxcore generate: error: --system needs --chat-template (the system message is a "
                                 "turn of the chat template; without it the prompts are tokenized as plain text)"], err
