"""A cluster's queue choice (``TopicRoute.send_order``): one key, one queue; without a key, every
queue in turn; after the first choice, the rest of the route for a send passed over."""

from __future__ import annotations

from engine.coordination.routes import BrokerRoute, TopicRoute

ROUTE = TopicRoute("orders", (BrokerRoute("broker-a", 3, "tcp://a"), BrokerRoute("broker-b", 2, "tcp://b")))


def test_each_turn_takes_the_next_queue_of_the_whole_route() -> None:
    firsts = [ROUTE.send_order(None, turn)[0] for turn in range(2 * len(ROUTE.queues))]
    assert firsts == ROUTE.queues * 2


def test_a_sharding_key_always_takes_its_queue_whatever_the_turn() -> None:
    for key in ("order-1", "order-2", ""):
        assert len({ROUTE.send_order(key, turn)[0] for turn in range(10)}) == 1
    assert len({ROUTE.send_order(f"order-{n}", 0)[0] for n in range(100)}) == len(ROUTE.queues)  # keys spread


def test_the_order_holds_every_queue_once_starting_at_the_choice() -> None:
    for choice in (None, "order-7"):
        for turn in range(len(ROUTE.queues)):
            order = ROUTE.send_order(choice, turn)
            assert sorted(order) == sorted(ROUTE.queues)
            start = ROUTE.queues.index(order[0])
            assert order == ROUTE.queues[start:] + ROUTE.queues[:start]
