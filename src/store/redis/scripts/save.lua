local endpoints, queue, hold, record, pending = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ready, paused, notices, notices_due, event = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local ws, we, id = ARGV[1], ARGV[2], ARGV[3]
local member, after = ws .. ' ' .. we, ARGV[10]
-- A failure at a URL the endpoint no longer has says nothing of it: nothing is saved.
if (after == 'failing' or after == 'pause') and ARGV[12] ~= '' then
  local raw = redis.call('HGET', endpoints, we)
  if raw then
    local ok, e = pcall(cjson.decode, raw)
    if ok and type(e) == 'table' and e.url ~= ARGV[12] then return 2 end
  end
end
-- Nor does a retry's failure whose hold is gone (a resume, or an answer, since its claim;
-- another delivery's failure may have made a new one), unless this is that very save again
-- (its reply was lost). A claim under a hold makes the claimed delivery its probe.
if (after == 'failing' or after == 'pause') and tonumber(ARGV[11]) >= 2
    and redis.call('HGET', hold, 'probe') ~= id
    and redis.call('GET', record) ~= ARGV[4] then
  return 2
end
redis.call('SET', record, ARGV[4], 'EX', ARGV[6])
if redis.call('EXPIRE', event, ARGV[6]) == 0 and ARGV[13] ~= '' then
  redis.call('SET', event, ARGV[13], 'EX', ARGV[6])
end
if tonumber(ARGV[5]) >= 0 then
  redis.call('ZADD', queue, ARGV[5], id)
elseif redis.call('ZREM', queue, id) == 1 then
  redis.call('DECR', pending)
end
if after == 'answered' or after == 'pause' then
  redis.call('DEL', hold)
elseif after == 'failing' and is_active(redis.call('HGET', endpoints, we)) then
  -- A later step, or the probe itself again (its lease ran out and it was claimed anew): an
  -- attempt that was in flight alongside it changes nothing.
  local failures = tonumber(ARGV[11])
  local h = redis.call('HMGET', hold, 'failures', 'probe')
  local current = tonumber(h[1] or '0')
  if failures > current or (failures == current and h[2] == id) then
    redis.call('HSET', hold, 'failures', failures, 'until', ARGV[5], 'probe', id, 'tries', 0)
    redis.call('EXPIRE', hold, ARGV[6])
  end
end
rescore(ready, hold, member, queue)
local notice = ARGV[7]
if notice ~= '' then
  local raw = redis.call('HGET', endpoints, we)
  if raw then
    local e = cjson.decode(raw)
    if e.status == 'active' then
      e.status = ARGV[14]
      redis.call('HSET', endpoints, we, cjson.encode(e))
      redis.call('SADD', paused, member)
      redis.call('HSET', notices, notice, ARGV[8])
      redis.call('ZADD', notices_due, ARGV[9], notice)
      return 1
    end
  end
end
return 0
