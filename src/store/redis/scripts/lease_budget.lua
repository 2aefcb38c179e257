-- Grants budget leases. KEYS: the month's spend hash, the workspace's project budgets, the
-- workspace record, then for each ask its lease hash (for a key, its lineage's after it).
-- ARGV[1]: the request as JSON. Lease entries are "granted spent expires_ms", micro-credits
-- counted from the lease's start; an entry past its expiry is dropped.
local r = cjson.decode(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local NO_LIMIT = 4503599627370496
local function num(v) return tonumber(v or '0') or 0 end
local function parse(v)
  local g, s, x = string.match(v, '^(%-?%d+) (%-?%d+) (%d+)$')
  return tonumber(g or '0'), tonumber(s or '0'), tonumber(x or '0')
end
-- The unspent part of every unexpired lease in hash h.
local function outstanding(h)
  local sum = 0
  local all = redis.call('HGETALL', h)
  for i = 1, #all, 2 do
    local g, s, x = parse(all[i + 1])
    if x <= now then
      redis.call('HDEL', h, all[i])
    elseif g > s then
      sum = sum + (g - s)
    end
  end
  return sum
end
local monthly_credits
local raw = redis.call('GET', KEYS[3])
if raw then
  local ws = cjson.decode(raw)
  if type(ws.monthly_credits) == 'number' then
    monthly_credits = math.floor(ws.monthly_credits * 1000000 + 0.5)
  end
end
local out = {}
local k = 4
for i, a in ipairs(r.asks) do
  local limit, spent, held = nil, 0, 0
  local own = KEYS[k]
  if string.sub(a.scope, 1, 4) == 'key:' then
    limit = a.limit
    local ids = {string.sub(a.scope, 5)}
    for _, p in ipairs(a.peers or {}) do ids[#ids + 1] = p end
    for _, id in ipairs(ids) do
      spent = spent + num(redis.call('HGET', KEYS[1], 'key:' .. id))
      held = held + outstanding(KEYS[k])
      k = k + 1
    end
  elseif string.sub(a.scope, 1, 8) == 'project:' then
    local name = string.sub(a.scope, 9)
    limit = tonumber(redis.call('HGET', KEYS[2], name) or '')
    if limit == nil and type(a.limit) == 'number' then limit = a.limit end
    spent = num(redis.call('HGET', KEYS[1], 'project:' .. name))
    held = outstanding(KEYS[k])
    k = k + 1
  else
    limit = monthly_credits
    spent = num(redis.call('HGET', KEYS[1], 'total'))
    held = outstanding(KEYS[k])
    k = k + 1
  end
  if limit == nil then limit = NO_LIMIT end
  local free = limit - spent - held
  local grant = 0
  if free > 0 then
    -- A share of what is left, in whole units of what one request reserves.
    local share, unit = math.max(r.share, 1), math.max(r.unit or 1, 1)
    local slice = math.ceil(math.ceil(free / share) / unit) * unit
    grant = math.min(free, math.max(a.ask, slice))
  end
  local g, s = 0, 0
  local v = redis.call('HGET', own, a.id)
  if v then g, s = parse(v) end
  g = g + grant
  redis.call('HSET', own, a.id, string.format('%d %d %d', g, s, now + r.ttl_ms))
  redis.call('PEXPIRE', own, r.ttl_ms * 2)
  out[i] = {granted = string.format('%d', g), free = string.format('%d', free - grant)}
end
return cjson.encode(out)
