-- Byte order, as sorted sets order members (Lua's own `<=` follows the locale).
local function bytes_le(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end
local key, since, after, max = KEYS[1], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local first = redis.call('ZRANGEBYSCORE', key, ARGV[1], '+inf', 'LIMIT', 0, 1)
if #first == 0 then return {} end
local start = redis.call('ZRANK', key, first[1])
if after ~= '' then
  local rank = nil
  local score = redis.call('ZSCORE', key, after)
  if score and tonumber(score) == since then rank = redis.call('ZRANK', key, after) end
  if rank then
    start = rank + 1
  else
    -- Not there any more: past the ids of that second that sort before it (at most ten
    -- pages of them: past that, a few may come again, which receivers deduplicate).
    for _ = 1, 10 do
      local page = redis.call('ZRANGE', key, start, start + 999, 'WITHSCORES')
      if #page == 0 then return {} end
      local moved = false
      for j = 1, #page, 2 do
        if tonumber(page[j + 1]) == since and bytes_le(page[j], after) then
          start = start + 1
          moved = true
        else
          moved = false
          break
        end
      end
      if not moved then break end
    end
  end
end
return redis.call('ZRANGE', key, start, start + max - 1, 'WITHSCORES')
