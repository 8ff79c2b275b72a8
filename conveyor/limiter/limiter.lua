-- Conveyor's concurrency limiter: three semaphores per node job (its workflow, its tenant and
-- the global one), taken all at once or not at all, with fair, priority-ordered waiting.
--
-- Called as EVALSHA with ARGV = op, prefix, lease_ms, op arguments... Every op runs atomically,
-- reads the time from Redis (one clock for all workers) and returns what the caller must do.
--
-- Keys (P = prefix):
--   P:limits            hash   key -> limit (written by every acquire: the latest settings win)
--   P:held:<key>        zset   permit token -> lease expiry (ms); expired members do not count
--   P:wq:<W>            zset   parked job -> class * 2^40 + arrival seq (priority, then FIFO)
--   P:tw:<T>            zset   eligible workflows of tenant T -> class * 2^40 + turn
--   P:ring              zset   eligible tenants -> class * 2^40 + turn (round-robin)
--   P:job:<id>          hash   a parked job: t (tenant key), w (workflow key), c (class), at,
--                              n (its node, to name its message when woken)
--   P:waiting           hash   key -> jobs parked under it (for `conveyor limits`)
--   P:waitw             hash   workflow key with parked jobs -> its tenant key (for the sweep)
--   P:low               zset   parked low-priority job -> parked at (ms), for ageing
--   P:grant:<id>        hash   a woken job's permit: tok (token), t, w; taken when it arrives
--   P:grant_exp         zset   woken job -> when its grant lapses
--   P:seq               counter for arrival order, turns and tokens
--
-- A workflow W is eligible when it has parked jobs and room under its own limit; a tenant T is
-- eligible when it has an eligible workflow and room under its limit. The pump serves the ring
-- while the global semaphore has room: the first tenant (best class, then longest since its
-- last turn), its first workflow the same way, that workflow's first job. A served tenant and
-- workflow go to the back of their line, which is what makes the ring round-robin.

local op, P, LEASE = ARGV[1], ARGV[2], tonumber(ARGV[3])
local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local C = 1099511627776 -- 2^40: the class weight in a score
local MAX_GRANTS = 256
local G = 'global'

local LIMITS, RING, WAITING, WAITW = P .. ':limits', P .. ':ring', P .. ':waiting', P .. ':waitw'
local LOW, GRANT_EXP, SEQ = P .. ':low', P .. ':grant_exp', P .. ':seq'
local function held(key) return P .. ':held:' .. key end
local function wq(w) return P .. ':wq:' .. w end
local function tw(t) return P .. ':tw:' .. t end
local function jobkey(id) return P .. ':job:' .. id end
local function grantkey(id) return P .. ':grant:' .. id end

local function in_use(key)
  redis.call('ZREMRANGEBYSCORE', held(key), '-inf', NOW)
  return redis.call('ZCARD', held(key))
end

local function has_room(key)
  local limit = redis.call('HGET', LIMITS, key)
  return limit == false or in_use(key) < tonumber(limit)
end

local function head_class(zkey)
  local head = redis.call('ZRANGE', zkey, 0, 0, 'WITHSCORES')
  if head[1] == nil then return nil end
  return math.floor(tonumber(head[2]) / C)
end

-- Put member in line at class cls: keep its turn if it is in line, else the back of the line.
local function place(zkey, member, cls, to_back)
  local score = redis.call('ZSCORE', zkey, member)
  local turn
  if score and not to_back then
    turn = tonumber(score) % C
  else
    turn = redis.call('INCR', SEQ)
  end
  redis.call('ZADD', zkey, cls * C + turn, member)
end

-- Recompute whether workflow w (of tenant t) and tenant t are eligible, and their classes.
local function refresh(t, w, served)
  local cls = head_class(wq(w))
  if cls ~= nil and has_room(w) then
    place(tw(t), w, cls, served)
  else
    redis.call('ZREM', tw(t), w)
  end
  local tcls = head_class(tw(t))
  if tcls ~= nil and has_room(t) then
    place(RING, t, tcls, served)
  else
    redis.call('ZREM', RING, t)
  end
end

local function count_waiting(t, w, delta)
  redis.call('HINCRBY', WAITING, w, delta)
  redis.call('HINCRBY', WAITING, t, delta)
  redis.call('HINCRBY', WAITING, G, delta)
end

local function park(id, t, w, cls, at, node)
  redis.call('ZADD', wq(w), cls * C + redis.call('INCR', SEQ), id)
  redis.call('HSET', jobkey(id), 't', t, 'w', w, 'c', cls, 'at', at, 'n', node)
  redis.call('HSET', WAITW, w, t)
  if cls == 2 then redis.call('ZADD', LOW, at, id) end
  count_waiting(t, w, 1)
end

-- Remove a parked job from its line; returns its tenant and workflow keys (nil if not parked).
local function unpark(id)
  local j = redis.call('HMGET', jobkey(id), 't', 'w')
  if j[1] == false then return nil, nil end
  local t, w = j[1], j[2]
  redis.call('ZREM', wq(w), id)
  if redis.call('ZCARD', wq(w)) == 0 then redis.call('HDEL', WAITW, w) end
  redis.call('ZREM', LOW, id)
  redis.call('DEL', jobkey(id))
  count_waiting(t, w, -1)
  return t, w
end

local function take(id, t, w)
  local token = id .. ':' .. redis.call('INCR', SEQ)
  local expiry = NOW + LEASE
  redis.call('ZADD', held(w), expiry, token)
  redis.call('ZADD', held(t), expiry, token)
  redis.call('ZADD', held(G), expiry, token)
  return token
end

local function give_back(token, t, w)
  redis.call('ZREM', held(w), token)
  redis.call('ZREM', held(t), token)
  redis.call('ZREM', held(G), token)
end

-- A woken job's grant, removed from the books: token, tenant key, workflow key (or nil).
local function pop_grant(id)
  local g = redis.call('HMGET', grantkey(id), 'tok', 't', 'w')
  if g[1] == false then return nil end
  redis.call('DEL', grantkey(id))
  redis.call('ZREM', GRANT_EXP, id)
  return g[1], g[2], g[3]
end

-- Serve the ring while the global semaphore has room. Appends to grants, for each job served:
-- its id, class, workflow key and node ('' when parked by a version that kept none).
local function pump(grants)
  local n = 0
  while n < MAX_GRANTS and has_room(G) do
    local t = redis.call('ZRANGE', RING, 0, 0)[1]
    if t == nil then return end
    local w = redis.call('ZRANGE', tw(t), 0, 0)[1]
    local id = w and redis.call('ZRANGE', wq(w), 0, 0)[1]
    if w == nil then
      redis.call('ZREM', RING, t) -- stale: no eligible workflow left
    elseif not id or not has_room(w) or not has_room(t) then
      refresh(t, w, false) -- stale: a line emptied or a semaphore filled meanwhile
    else
      local j = redis.call('HMGET', jobkey(id), 'c', 'n')
      local cls, node = j[1] or '1', j[2] or ''
      unpark(id)
      local token = take(id, t, w)
      redis.call('HSET', grantkey(id), 'tok', token, 't', t, 'w', w)
      redis.call('ZADD', GRANT_EXP, NOW + LEASE, id)
      table.insert(grants, id)
      table.insert(grants, cls)
      table.insert(grants, w)
      table.insert(grants, node)
      refresh(t, w, true)
    end
    n = n + 1
  end
end

local function set_limits(t, w, lg, lt, lw)
  redis.call('HSET', LIMITS, G, lg, t, lt, w, lw)
end

if op == 'acquire' then
  -- ARGV: job id, tenant key, workflow key, class (0 high, 1 normal, 2 low), limits g t w
  -- ARGV[11]: when the job was enqueued (ms), which ageing counts from; ARGV[12]: its node
  local id, t, w, cls = ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
  local enqueued = math.min(tonumber(ARGV[11]) or NOW, NOW)
  set_limits(t, w, ARGV[8], ARGV[9], ARGV[10])
  local grants = {}
  local granted, gt, gw = pop_grant(id)
  if granted then -- woken: its permits were taken for it when it was served
    local expiry = NOW + LEASE
    redis.call('ZADD', held(gw), 'XX', expiry, granted)
    redis.call('ZADD', held(gt), 'XX', expiry, granted)
    redis.call('ZADD', held(G), 'XX', expiry, granted)
    if redis.call('ZSCORE', held(G), granted) and gt == t and gw == w then
      return {'granted', granted, grants}
    end
    give_back(granted, gt, gw) -- lapsed, or the job moved: ask again like a new job
  end
  if redis.call('EXISTS', jobkey(id)) == 1 then
    return {'parked', w, grants} -- a duplicate message of a job that already waits
  end
  pump(grants) -- serve anyone an expired lease made room for before deciding
  if redis.call('ZCARD', wq(w)) == 0 and has_room(w) and has_room(t) and has_room(G) then
    return {'granted', take(id, t, w), grants}
  end
  local blocked = w -- the first full semaphore, or its workflow's line
  if redis.call('ZCARD', wq(w)) == 0 then
    if not has_room(w) then blocked = w elseif not has_room(t) then blocked = t else blocked = G end
  end
  park(id, t, w, cls, enqueued, ARGV[12] or '')
  refresh(t, w, false)
  pump(grants)
  local mine = pop_grant(id)
  if mine then -- served at once by the pump (it was first in line)
    local others = {}
    for i = 1, #grants, 4 do
      if grants[i] ~= id then
        for k = 0, 3 do table.insert(others, grants[i + k]) end
      end
    end
    return {'granted', mine, others}
  end
  return {'parked', blocked, grants}

elseif op == 'release' then
  -- ARGV: token, tenant key, workflow key
  local token, t, w = ARGV[4], ARGV[5], ARGV[6]
  give_back(token, t, w)
  local grants = {}
  refresh(t, w, false)
  pump(grants)
  return grants

elseif op == 'renew' then
  -- ARGV: token, tenant key, workflow key, repeated; returns the tokens whose lease had lapsed
  local expiry, lapsed = NOW + LEASE, {}
  for i = 4, #ARGV, 3 do
    local token, t, w = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    redis.call('ZADD', held(w), 'XX', expiry, token)
    redis.call('ZADD', held(t), 'XX', expiry, token)
    redis.call('ZADD', held(G), 'XX', expiry, token)
    if redis.call('ZSCORE', held(G), token) == false then table.insert(lapsed, token) end
  end
  return lapsed

elseif op == 'sweep' then
  -- ARGV: age_ms. Return permits whose lease lapsed, age low jobs, drop lapsed grants, pump.
  local age_ms = tonumber(ARGV[4])
  local old = redis.call('ZRANGEBYSCORE', LOW, '-inf', NOW - age_ms, 'LIMIT', 0, 1000)
  for _, id in ipairs(old) do
    local j = redis.call('HMGET', jobkey(id), 'w')
    local score = j[1] and redis.call('ZSCORE', wq(j[1]), id)
    if score then
      redis.call('ZADD', wq(j[1]), C + tonumber(score) % C, id)
      redis.call('HSET', jobkey(id), 'c', 1)
    end
    redis.call('ZREM', LOW, id)
  end
  local lapsed = redis.call('ZRANGEBYSCORE', GRANT_EXP, '-inf', NOW, 'LIMIT', 0, 1000)
  for _, id in ipairs(lapsed) do
    local token, t, w = pop_grant(id)
    if token then give_back(token, t, w) end
  end
  local waitw = redis.call('HGETALL', WAITW)
  for i = 1, #waitw, 2 do refresh(waitw[i + 1], waitw[i], false) end
  local grants = {}
  pump(grants)
  return {#old, #lapsed, grants}

elseif op == 'forget' then
  -- ARGV: job ids that will never run (cancelled): leave the lines, give back any grant.
  local grants = {}
  for i = 4, #ARGV do
    local id = ARGV[i]
    local t, w = unpark(id)
    if t then refresh(t, w, false) end
    local token, gt, gw = pop_grant(id)
    if token then
      give_back(token, gt, gw)
      refresh(gt, gw, false)
    end
  end
  pump(grants)
  return grants

elseif op == 'status' then
  -- ARGV: job ids; returns for each 'parked', 'granted' or '' (unknown to the limiter)
  local out = {}
  for i = 4, #ARGV do
    local id = ARGV[i]
    if redis.call('EXISTS', jobkey(id)) == 1 then
      table.insert(out, 'parked')
    elseif redis.call('EXISTS', grantkey(id)) == 1 then
      table.insert(out, 'granted')
    else
      table.insert(out, '')
    end
  end
  return out

elseif op == 'snapshot' then
  -- every known key with its permits in use, its limit and the jobs parked under it
  local out = {}
  local limits = redis.call('HGETALL', LIMITS)
  for i = 1, #limits, 2 do
    local key = limits[i]
    local used = redis.call('ZCOUNT', held(key), '(' .. NOW, '+inf')
    local waiting = tonumber(redis.call('HGET', WAITING, key) or '0')
    table.insert(out, key)
    table.insert(out, used)
    table.insert(out, tonumber(limits[i + 1]))
    table.insert(out, waiting)
  end
  return out
end

return redis.error_reply('conveyor limiter: unknown op ' .. tostring(op))
