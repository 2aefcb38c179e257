-- The one script that builds keys from the prefix (ARGV[1]) instead of taking them in KEYS:
-- the endpoints it claims from are found in the ready set as it goes. On Redis Cluster a claim
-- would first read the ready set, then claim per endpoint with its keys.
local p, now, lease_end = ARGV[1], ARGV[2], ARGV[3]
local max, per = tonumber(ARGV[4]), tonumber(ARGV[5])
local busy = cjson.decode(ARGV[6])
local struggling, struggling_left = cjson.decode(ARGV[7]), tonumber(ARGV[8])
local out, taken = {}, 0
-- Due endpoints, oldest first, a page at a time: endpoints with no room (busy, or failing with
-- their share of slots used up) are passed over without a call, and the pages go on past them,
-- so a thousand dead endpoints cannot keep a healthy one's deliveries waiting. An endpoint
-- claimed from is rescored (its queue's next due time, or its lease) and may come round again
-- in a later page: it is visited once. At most CLAIM_SCAN members are looked at per claim.
local visited, passed, scanned = {}, 0, 0
while taken < max and scanned < CLAIM_SCAN do
 local ready = redis.call('ZRANGEBYSCORE', p .. ':wh:ready', '-inf', now, 'LIMIT', passed, CLAIM_PAGE)
 if #ready == 0 then break end
 for _, member in ipairs(ready) do
  if taken >= max then break end
  scanned = scanned + 1
  local sp = string.find(member, ' ', 1, true)
  local ws, we = string.sub(member, 1, sp - 1), string.sub(member, sp + 1)
  local room = math.min(per - (busy[we] or 0), max - taken)
  if struggling[we] then room = math.min(room, struggling_left) end
  local hold, queue = p .. ':wh:hold:' .. we, p .. ':wh:due:' .. we
  local endpoint, held, failures, probe, tries = nil, false, '0', nil, 0
  local step = 'take'
  if visited[member] or room <= 0 then
    step = 'pass'
  else
    -- Held back by a failure: not before its hold, then one at a time, counted as
    -- struggling; the endpoint is read only then (a hold on one that is not active goes).
    local h = redis.call('HMGET', hold, 'until', 'probe', 'failures', 'tries')
    if h[1] and tonumber(h[1]) > tonumber(now) then
      step = 'early'
    elseif h[1] and struggling_left <= 0 then
      step = 'pass'
    elseif h[1] then
      endpoint = redis.call('HGET', p .. ':endpoints:' .. ws, we) or ''
      if is_active(endpoint) then
        held, probe, failures, tries = true, h[2], h[3] or '0', tonumber(h[4] or '0')
        room = math.min(room, 1)
      else
        redis.call('DEL', hold)
      end
    end
  end
  if step == 'pass' then
    passed = passed + 1
  elseif step == 'early' then
    -- Scored before its hold (by an older version): put in its place, out of this range.
    visited[member] = true
    rescore(p .. ':wh:ready', p .. ':wh:hold:' .. we, member, queue)
  else
    visited[member] = true
    local ids
    local probe_due = held and probe and redis.call('ZSCORE', queue, probe)
    probe_due = probe_due and tonumber(probe_due) <= tonumber(now)
    if probe_due and tries < PROBE_TRIES then
      ids = {probe}
    elseif held then
      -- The failed delivery was claimed PROBE_TRIES times and never saved (its workers died,
      -- or none can read it): the next one due goes in its place.
      ids = {}
      for _, id in ipairs(redis.call('ZRANGEBYSCORE', queue, '-inf', now, 'LIMIT', 0, 2)) do
        if id ~= probe and #ids == 0 then ids[1] = id end
      end
      if #ids == 0 and probe_due then ids = {probe} end
    else
      ids = redis.call('ZRANGEBYSCORE', queue, '-inf', now, 'LIMIT', 0, room)
    end
    if #ids > 0 and not endpoint then
      endpoint = redis.call('HGET', p .. ':endpoints:' .. ws, we) or ''
    end
    for _, id in ipairs(ids) do
      local json = redis.call('GET', p .. ':wh:dlv:' .. id)
      if json then
        redis.call('ZADD', queue, lease_end, id)
        out[#out + 1] = endpoint
        out[#out + 1] = json
        out[#out + 1] = failures
        taken = taken + 1
        if struggling[we] or held then struggling_left = struggling_left - 1 end
        if held and id == probe then
          redis.call('HSET', hold, 'until', lease_end, 'tries', tries + 1)
        elseif held then
          redis.call('HSET', hold, 'until', lease_end, 'probe', id, 'tries', 1)
        end
      else
        redis.call('ZREM', queue, id)
        redis.call('DECR', p .. ':wh:pending')
      end
    end
    rescore(p .. ':wh:ready', p .. ':wh:hold:' .. we, member, queue)
  end
 end
end
return out
