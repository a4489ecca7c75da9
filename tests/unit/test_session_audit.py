"""What an exec session's audit record keeps of its command: all of a command of common
size, and a bounded part of a huge one, saying how much it left out."""

from __future__ import annotations

from corral.workspaces.session_audit import MAX_COMMAND, recorded


def test_a_command_of_common_size_is_kept_whole() -> None:
    command = ["/bin/sh", "-c", "x" * (MAX_COMMAND - 9)]
    assert recorded(command) == tuple(command)
    assert recorded([]) == ()


def test_a_huge_command_is_cut_at_the_bound_saying_how_much_was_left_out() -> None:
    """The API takes 4096 arguments of 64 KiB; the record keeps MAX_COMMAND characters."""
    command = ["python3", "-c", "y" * MAX_COMMAND, *(["z" * 65536] * 4095)]
    kept = recorded(command)
    assert kept[:2] == ("python3", "-c") and kept[2] == "y" * (MAX_COMMAND - 9)
    total = sum(map(len, command))
    assert kept[3:] == (f"[{total - MAX_COMMAND} more characters]",)
    assert sum(map(len, kept[:3])) == MAX_COMMAND
