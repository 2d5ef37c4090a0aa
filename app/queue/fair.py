"""A fair place in an RQ queue: a job of a client with nothing else queued or running goes
ahead of the other clients' backlogs, behind the earlier such jobs (first come, first served
among them), so one client's bulk submissions never stand between another client and its one
analysis. One Lua script, atomic with the workers' dequeues."""

from __future__ import annotations

from redis import Redis
from rq import Queue

from model_worker.service.queue.keys import ahead_key

#: KEYS: the queue's list, the set of jobs placed ahead; ARGV: the job id. Moves the job from
#: the tail to just behind the last job placed ahead; forgets ahead-jobs no longer queued.
#: Returns the job's new position, or -1 if a worker took it meanwhile.
_PLACE_AHEAD = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return -1 end
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
local queued = {}
for _, id in ipairs(ids) do queued[id] = true end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if not queued[id] then redis.call('SREM', KEYS[2], id) end
end
redis.call('SADD', KEYS[2], ARGV[1])
for i, id in ipairs(ids) do
  if redis.call('SISMEMBER', KEYS[2], id) == 0 then
    redis.call('LINSERT', KEYS[1], 'BEFORE', id, ARGV[1])
    return i - 1
  end
end
redis.call('RPUSH', KEYS[1], ARGV[1])
return #ids
"""


def place_ahead(connection: Redis, queue: Queue, job_id: str) -> int | None:
    """Move the just-enqueued `job_id` ahead of the backlogs; its position (None if taken)."""
    position = int(connection.eval(_PLACE_AHEAD, 2, queue.key, ahead_key(queue.name), job_id))
    return None if position < 0 else position
