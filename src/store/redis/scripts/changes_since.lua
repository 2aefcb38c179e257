local function mark_at(e)
  if e == 0 then return '0' end
  local at = redis.call('XRANGE', KEYS[2], e .. '-0', e .. '-0')
  if #at == 0 then return '-' end
  return at[1][2][4] or '0'
end
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local since = tonumber(ARGV[1])
local mark = mark_at(cur)
if cur < since or cur - since > tonumber(ARGV[2]) then return {cur, mark, 'reset'} end
if since > 0 and mark_at(since) ~= ARGV[3] then return {cur, mark, 'reset'} end
if cur == since then return {cur, mark} end
local first = (since + 1) .. '-0'
local entries = redis.call('XRANGE', KEYS[2], first, '+', 'COUNT', ARGV[2])
if #entries == 0 or entries[1][1] ~= first then return {cur, mark, 'reset'} end
local out = {cur, mark}
for _, entry in ipairs(entries) do out[#out + 1] = entry[2][2] end
return out
