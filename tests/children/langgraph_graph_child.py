"""A small LangGraph agent run in a child process by tests/integrations/test_langgraph.py:
three nodes, an ``interrupt`` in the second; ``crash`` mode stops in the second node (the
test kills it with SIGKILL there), ``resume`` picks the thread up from the checkpointer,
``full`` runs a fresh thread without stopping. Prints the final state as JSON."""

from __future__ import annotations

import json
import operator
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from ares_events.integrations.langgraph import AresSaver


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int


def build(saver: AresSaver, marker: Path | None) -> Any:
    def step1(state: State) -> dict[str, Any]:
        return {"log": ["step1"], "n": state["n"] + 1}

    def step2(state: State) -> dict[str, Any]:
        if marker is not None:
            marker.write_text("in step2")
            time.sleep(120)  # the test kills the process here, between step1 and step3
        answer = interrupt("approve?")
        return {"log": [f"step2:{answer}"], "n": state["n"] * 10}

    def step3(state: State) -> dict[str, Any]:
        return {"log": ["step3"], "n": state["n"] + 7}

    g = StateGraph(State)
    g.add_node("step1", step1)
    g.add_node("step2", step2)
    g.add_node("step3", step3)
    g.add_edge(START, "step1")
    g.add_edge("step1", "step2")
    g.add_edge("step2", "step3")
    g.add_edge("step3", END)
    return g.compile(checkpointer=saver)


def main(argv: list[str]) -> int:
    url, thread_id, mode = argv[:3]
    config: Any = {"configurable": {"thread_id": thread_id}}
    with AresSaver.from_url(url) as saver:
        if mode == "crash":
            graph = build(saver, Path(argv[3]))
            graph.invoke({"log": [], "n": 1}, config, durability="sync")
            return 3  # never reached: killed in step2
        graph = build(saver, None)
        if mode == "full":
            graph.invoke({"log": [], "n": 1}, config, durability="sync")
        else:  # resume: from the last checkpoint the killed run saved
            graph.invoke(None, config, durability="sync")
        out = graph.invoke(Command(resume="yes"), config, durability="sync")
        print(json.dumps({"log": out["log"], "n": out["n"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
