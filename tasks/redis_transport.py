"""kombu's Redis transport, with a delivered message forgotten even when Redis did not
confirm its ack.

kombu drops a message from its prefetch accounting only after Redis has confirmed the
ack. An ack that times out (a frozen Redis: every call is bounded, storage/redisconn.py)
therefore leaves the message counted for ever, and with a prefetch of 1 the worker
never takes another message, long after Redis has come back. Here the message is
forgotten locally either way (and the error still raised, so Celery logs it). The
unconfirmed message stays in Redis's unacked set and is restored after the visibility
timeout; its render message then claims nothing, since the job is no longer queued with
that dispatch token.
"""

from __future__ import annotations

from kombu.transport import redis, virtual


class QoS(redis.QoS):
    def ack(self, delivery_tag) -> None:
        try:
            super().ack(delivery_tag)
        except Exception:
            virtual.QoS.ack(self, delivery_tag)
            raise

    def reject(self, delivery_tag, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue)
        except Exception:
            virtual.QoS.ack(self, delivery_tag)
            raise


class Channel(redis.Channel):
    QoS = QoS


class Transport(redis.Transport):
    """``broker_transport`` for a Redis broker (tasks/app.py)."""

    Channel = Channel
