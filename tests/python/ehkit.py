"""Helpers for the suites that read the hub's Event Hubs-compatible endpoint with the unmodified
`azure-eventhub` SDK: a consumer client for a hub, and bounded reads that stop by themselves.

The SDK is configured, not changed: the connection string `ferrohub connection-string
--event-hubs` prints, `custom_endpoint_address` for the hub's AMQP port, and `connection_verify`
for its CA.
"""

from __future__ import annotations

import threading
import time

from azure.eventhub import EventHubConsumerClient

from clusterkit import node_ip

WAIT = 30
# How long a partition must stay quiet to count as read to its end. The events a test reads are
# durable before it reads them, so this only has to outlast the hub's gap between two batches
# of a partition; every read pays it once more when the client closes.
IDLE = 0.5


def event_hubs_connection_string(hub, policy: str = "service") -> str:
    """The hub's Event Hubs connection string for `policy`, asked of the CLI once per hub (each
    call opens the data directory: about half a second on a busy machine)."""
    cache = hub.__dict__.setdefault("_event_hubs_connection_strings", {})
    if policy not in cache:
        cache[policy] = hub.cli("connection-string", "--policy", policy, "--event-hubs")
    return cache[policy]


def consumer(hub, group: str = "$Default", connection_string: str | None = None, node: str | None = None,
             **kw) -> EventHubConsumerClient:
    """A consumer of `hub`; in a cluster, of one `node` instead of the balancer when named."""
    endpoint = f"amqps://{node_ip(node)}:5671" if node else f"amqps://localhost:{hub.amqp_port}"
    return EventHubConsumerClient.from_connection_string(
        connection_string or event_hubs_connection_string(hub),
        consumer_group=group,
        custom_endpoint_address=endpoint,
        connection_verify=hub.ca,
        **kw,
    )


class Collector:
    """Events (and errors) a `receive` callback got, with a wait for a count."""

    def __init__(self):
        self.events = []
        self.errors = []
        self.idle = 0
        # Partitions whose last callback said nothing more arrived within max_wait_time.
        self.idle_partitions = set()
        self.cond = threading.Condition()

    def on_event(self, partition_context, event):
        with self.cond:
            if event is None:
                self.idle += 1
                self.idle_partitions.add(partition_context.partition_id)
            else:
                self.idle_partitions.discard(partition_context.partition_id)
                self.events.append((partition_context.partition_id, event))
            self.cond.notify_all()

    def on_error(self, partition_context, error):
        with self.cond:
            self.errors.append((partition_context.partition_id if partition_context else None, error))
            self.cond.notify_all()

    def wait_for(self, predicate, timeout: float = WAIT) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: predicate(self), timeout)


def receive_in_background(client: EventHubConsumerClient, collector: Collector, **kw) -> threading.Thread:
    kw.setdefault("max_wait_time", IDLE)
    thread = threading.Thread(
        target=client.receive,
        kwargs=dict(on_event=collector.on_event, on_error=collector.on_error, **kw),
        daemon=True,
    )
    thread.start()
    return thread


def read(hub, n: int | None = None, timeout: float = WAIT, **kw) -> Collector:
    """Receives until `n` events arrived (if given) and every partition read has fallen idle
    (nothing within max_wait_time), so extra events would show; then closes the client."""
    client = consumer(hub)
    partitions = {kw["partition_id"]} if "partition_id" in kw else set(client.get_partition_ids())
    collector = Collector()
    thread = receive_in_background(client, collector, **kw)
    try:
        if n is not None:
            assert collector.wait_for(lambda c: len(c.events) >= n, timeout), \
                f"got {len(collector.events)} of {n} events; errors {collector.errors}"
        assert collector.wait_for(lambda c: c.idle_partitions >= partitions, timeout), \
            f"partitions {partitions - collector.idle_partitions} never fell idle; errors {collector.errors}"
    finally:
        # The receive thread takes about a second more to wind down its partition links after
        # close(); what it collected is complete, so it ends in the background.
        client.close()
    return collector


def device_of(event) -> str:
    return event.system_properties[b"iothub-connection-device-id"].decode()


def module_of(event) -> str | None:
    m = event.system_properties.get(b"iothub-connection-module-id")
    return m.decode() if m is not None else None


def prop(event, name: str) -> str:
    v = event.properties[name.encode()]
    return v.decode() if isinstance(v, bytes) else v


def wait_partition_total(client, n: int, timeout: float = WAIT) -> None:
    """Waits until the partitions hold `n` events in all (what was sent is durable)."""
    deadline = time.time() + timeout
    while True:
        total = 0
        for p in client.get_partition_ids():
            info = client.get_partition_properties(p)
            if not info["is_empty"]:
                total += info["last_enqueued_sequence_number"] - info["beginning_sequence_number"] + 1
        if total >= n or time.time() > deadline:
            return
        time.sleep(0.2)
