local p, ws, we, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local queue, member = p .. ':wh:due:' .. we, ws .. ' ' .. we
local hold, after = p .. ':wh:hold:' .. we, ARGV[11]
-- A failure at a URL the endpoint no longer has says nothing of it: nothing is saved.
if (after == 'failing' or after == 'pause') and ARGV[13] ~= '' then
  local raw = redis.call('HGET', p .. ':endpoints:' .. ws, we)
  if raw then
    local ok, e = pcall(cjson.decode, raw)
    if ok and type(e) == 'table' and e.url ~= ARGV[13] then return 2 end
  end
end
-- Nor does a retry's failure whose hold is gone (a resume, or an answer, since its claim;
-- another delivery's failure may have made a new one), unless this is that very save again
-- (its reply was lost). A claim under a hold makes the claimed delivery its probe.
if (after == 'failing' or after == 'pause') and tonumber(ARGV[12]) >= 2
    and redis.call('HGET', hold, 'probe') ~= id
    and redis.call('GET', p .. ':wh:dlv:' .. id) ~= ARGV[5] then
  return 2
end
redis.call('SET', p .. ':wh:dlv:' .. id, ARGV[5], 'EX', ARGV[7])
if redis.call('EXPIRE', ARGV[14], ARGV[7]) == 0 and ARGV[15] ~= '' then
  redis.call('SET', ARGV[14], ARGV[15], 'EX', ARGV[7])
end
if tonumber(ARGV[6]) >= 0 then
  redis.call('ZADD', queue, ARGV[6], id)
elseif redis.call('ZREM', queue, id) == 1 then
  redis.call('DECR', p .. ':wh:pending')
end
if after == 'answered' or after == 'pause' then
  redis.call('DEL', hold)
elseif after == 'failing' and is_active(redis.call('HGET', p .. ':endpoints:' .. ws, we)) then
  -- A later step, or the probe itself again (its lease ran out and it was claimed anew): an
  -- attempt that was in flight alongside it changes nothing.
  local failures = tonumber(ARGV[12])
  local h = redis.call('HMGET', hold, 'failures', 'probe')
  local current = tonumber(h[1] or '0')
  if failures > current or (failures == current and h[2] == id) then
    redis.call('HSET', hold, 'failures', failures, 'until', ARGV[6], 'probe', id, 'tries', 0)
    redis.call('EXPIRE', hold, ARGV[7])
  end
end
rescore(p .. ':wh:ready', p .. ':wh:hold:' .. we, member, queue)
local notice = ARGV[8]
if notice ~= '' then
  local endpoints = p .. ':endpoints:' .. ws
  local raw = redis.call('HGET', endpoints, we)
  if raw then
    local e = cjson.decode(raw)
    if e.status == 'active' then
      e.status = 'paused'
      redis.call('HSET', endpoints, we, cjson.encode(e))
      redis.call('SADD', p .. ':wh:paused', member)
      redis.call('HSET', p .. ':wh:notices', notice, ARGV[9])
      redis.call('ZADD', p .. ':wh:notices:due', ARGV[10], notice)
      return 1
    end
  end
end
return 0
