local b = cjson.decode(ARGV[1])
local function int(n)
  if n >= 9223372036854775807 then return '9223372036854775807' end
  return string.format('%d', n)
end
-- HINCRBY, clamped at the largest 64-bit integer instead of failing the whole batch (which
-- would then be retried for ever): a backend reporting absurd costs must not jam spend.
local function incr(h, field, n)
  local r = redis.pcall('HINCRBY', h, field, n)
  if type(r) == 'table' then
    redis.call('HSET', h, field, '9223372036854775807')
    return tonumber('9223372036854775807')
  end
  return r
end
-- A batch is added once: a retry after a lost answer only reads the totals.
local fresh = redis.call('SET', KEYS[2], '1', 'NX', 'EX', 86400)
local out = {workspaces = {}, rate = {}}
local k = 4
for _, w in ipairs(b.workspaces) do
  local h, budgets_key, workspace_key = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  k = k + 3
  -- Spend of an earlier month goes to that month, and reads nothing back.
  local month = w.month or b.month
  if not fresh then w.total = 0; w.keys = {}; w.projects = {} end
  local total
  if w.total ~= 0 then
    total = incr(h, 'total', int(w.total))
    redis.call('EXPIRE', h, 34560000)
  else
    total = tonumber(redis.call('HGET', h, 'total') or '0')
  end
  for id, inc in pairs(w.keys) do incr(h, 'key:' .. id, int(inc)) end
  for name, inc in pairs(w.projects) do incr(h, 'project:' .. name, int(inc)) end
  if month == b.month then
  local res = {total = int(total), keys = {}, projects = {}, project_budgets = {}}
  for _, id in ipairs(w.watch_keys) do res.keys[id] = redis.call('HGET', h, 'key:' .. id) or '0' end
  for _, name in ipairs(w.watch_projects) do
    res.projects[name] = redis.call('HGET', h, 'project:' .. name) or '0'
  end
  local budgets = redis.call('HGETALL', budgets_key)
  for i = 1, #budgets, 2 do res.project_budgets[budgets[i]] = budgets[i + 1] end
  local raw = redis.call('GET', workspace_key)
  if raw then
    local ws = cjson.decode(raw)
    if type(ws.monthly_credits) == 'number' then
      local credits = math.floor(ws.monthly_credits * 1000000 + 0.5)
      res.monthly_credits = int(credits)
      if type(ws.credits_low_threshold) == 'number' then
        local threshold = math.floor(ws.credits_low_threshold * 1000000 + 0.5)
        local remaining = credits - total
        if remaining < threshold then
          if redis.call('HSETNX', h, 'low_fired', '1') == 1 then
            local data = cjson.encode({workspace = w.workspace, month = b.month,
              remaining = math.max(remaining, 0) / 1000000, threshold = threshold / 1000000})
            redis.call('XADD', KEYS[1], '*', 'id', w.event_id, 'type', 'billing.credits.low',
              'created', int(b.now), 'workspace', w.workspace, 'environment', 'live', 'data', data)
          end
        else
          redis.call('HDEL', h, 'low_fired')
        end
      end
    end
  end
  out.workspaces[w.workspace] = res
  end
end
-- Rate counts go in batches of their own: a retry sends the same counts under the same id.
local fresh_rate = false
local last_used = KEYS[#KEYS]
for _, r in ipairs(b.rate) do
  if r.count > 0 then
    fresh_rate = redis.call('SET', KEYS[3], '1', 'NX', 'EX', 86400)
    break
  end
end
for _, r in ipairs(b.rate) do
  local current, previous = KEYS[k], KEYS[k + 1]
  k = k + 2
  local cur
  if fresh_rate and r.count > 0 then
    cur = redis.call('INCRBY', current, int(r.count))
    redis.call('EXPIRE', current, 180)
  else
    cur = tonumber(redis.call('GET', current) or '0')
  end
  local prev = redis.call('GET', previous) or '0'
  out.rate[r.key] = {window = int(r.window), previous = prev, current = int(cur)}
  -- A key's last use, to the minute: the start of the latest window it had requests in.
  if fresh_rate and r.count > 0 then
    local used = r.window * 60
    local seen = tonumber(redis.call('HGET', last_used, r.key) or '0')
    if used > seen then redis.call('HSET', last_used, r.key, int(used)) end
  end
end
-- Budget leases (keys after the rate counts', in the flush's order): the spend recorded
-- against each, renewed for ARGV[2] ms, or dropped when returned. Absolute values: a retried
-- batch changes nothing twice.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2] or '0') or 0
for _, w in ipairs(b.workspaces) do
  for _, l in ipairs(w.leases or {}) do
    local h = KEYS[k]
    k = k + 1
    local v = redis.call('HGET', h, l.id)
    if v then
      local g, s, x = string.match(v, '^(%-?%d+) (%-?%d+) (%d+)$')
      g, s, x = tonumber(g or '0'), tonumber(s or '0'), tonumber(x or '0')
      if x <= now or l.release then
        redis.call('HDEL', h, l.id)
      else
        s = math.max(s, l.spent)
        redis.call('HSET', h, l.id, string.format('%d %d %d', g, s, now + ttl))
        redis.call('PEXPIRE', h, ttl * 2)
      end
    end
  end
end
return cjson.encode(out)
