table _migrations
  name TEXT PK1
  applied_at TEXT NOT NULL
  index unique (name) pk
table checks
  id INTEGER PK1
  task_id INTEGER NOT NULL
  round INTEGER
  command TEXT
  exit_code INTEGER
  passed INTEGER NOT NULL
  head_sha TEXT
  output_path TEXT
  duration_s REAL
  created_at TEXT
  fk task_id -> tasks.id
table commits
  id INTEGER PK1
  task_id INTEGER NOT NULL
  round INTEGER
  sha TEXT NOT NULL
  parent TEXT
  message TEXT
  created_at TEXT
  fk task_id -> tasks.id
  index (task_id, round) c
table conclusions
  id INTEGER PK1
  error_id TEXT NOT NULL
  kind TEXT NOT NULL
  brief TEXT
  reason TEXT
  decided_by TEXT NOT NULL
  lane_run_id INTEGER
  created_at TEXT
  fk error_id -> errors.id
  index unique (error_id) c
table cursors
  source TEXT PK1
  value TEXT
  updated_at TEXT
  index unique (source) pk
table errors
  id TEXT PK1
  fingerprint TEXT NOT NULL
  service TEXT NOT NULL
  environment TEXT
  class TEXT
  message TEXT
  excerpt TEXT
  signature TEXT
  frames TEXT
  repo TEXT
  level TEXT
  release TEXT
  count INTEGER NOT NULL DEFAULT 1
  first_seen TEXT
  last_seen TEXT
  state TEXT NOT NULL DEFAULT 'open'
  state_reason TEXT
  created_at TEXT
  index (last_seen) c
  index (state, last_seen) c
  index (fingerprint) c
  index unique (id) pk
table events
  id INTEGER PK1
  ts TEXT NOT NULL
  task_id INTEGER
  error_id TEXT
  kind TEXT NOT NULL
  actor TEXT NOT NULL
  payload TEXT
  index (task_id, id) c
table forge_pending
  key TEXT PK1
  kind TEXT NOT NULL
  task_id INTEGER
  until REAL
  reason TEXT
  attempts INTEGER DEFAULT 0
  updated_at TEXT
  index unique (key) pk
table gates
  id INTEGER PK1
  task_id INTEGER NOT NULL
  round INTEGER
  stage TEXT
  dimension TEXT
  verdict TEXT NOT NULL
  findings_count INTEGER
  head_sha TEXT NOT NULL
  lane_run_id INTEGER NOT NULL
  created_at TEXT
  fk lane_run_id -> lane_runs.id
  fk task_id -> tasks.id
table hook_deliveries
  id INTEGER PK1
  hook TEXT NOT NULL
  key TEXT NOT NULL
  events INTEGER
  new INTEGER
  deduplicated INTEGER
  received_at TEXT NOT NULL
  index unique (hook, key) c
table lane_runs
  id INTEGER PK1
  task_id INTEGER
  error_id TEXT
  round INTEGER
  role TEXT NOT NULL
  vendor TEXT NOT NULL
  attempt INTEGER
  manifest_hash TEXT
  manifest TEXT
  session_id TEXT
  status TEXT NOT NULL
  findings_count INTEGER
  findings_text TEXT
  summary TEXT
  lesson TEXT
  reason TEXT
  exit_code INTEGER
  cost_usd REAL
  usage TEXT
  repairs TEXT
  log_dir TEXT
  head_sha TEXT
  pid INTEGER
  started_at TEXT
  ended_at TEXT
  pid_start INTEGER
  reserved_usd REAL
  fk task_id -> tasks.id
  index (role, vendor) c
  index (started_at) c
  index (task_id, round, role) c
table leases
  name TEXT PK1
  holder TEXT
  runner TEXT
  token INTEGER NOT NULL
  until REAL
  updated_at TEXT
  scope TEXT
  index unique (name) pk
table ledger_keys
  name TEXT PK1
  value TEXT NOT NULL
  created_at TEXT NOT NULL
  index unique (name) pk
table lessons
  id INTEGER PK1
  service TEXT
  fingerprint TEXT
  text TEXT NOT NULL
  task_id INTEGER
  created_at TEXT
  state TEXT NOT NULL DEFAULT 'candidate'
  reason TEXT
  lane_run_id INTEGER
  decided_by TEXT
  updated_at TEXT
  fk task_id -> tasks.id
  index (task_id) c
  index (state, service) c
  index (service) c
table local_pr_checks
  id INTEGER PK1
  repo TEXT NOT NULL
  sha TEXT NOT NULL
  kind TEXT
  name TEXT NOT NULL
  state TEXT NOT NULL
  conclusion TEXT
  summary TEXT
  url TEXT
  created_at TEXT
  index (repo, sha) c
table local_pr_notes
  id INTEGER PK1
  repo TEXT NOT NULL
  number INTEGER NOT NULL
  kind TEXT NOT NULL
  review_id INTEGER
  author TEXT NOT NULL
  body TEXT
  state TEXT
  path TEXT
  line INTEGER
  created_at TEXT
  index (repo, number, id) c
table local_prs
  id INTEGER PK1
  repo TEXT NOT NULL
  number INTEGER NOT NULL
  head TEXT NOT NULL
  head_sha TEXT
  base TEXT NOT NULL
  title TEXT
  body TEXT
  state TEXT NOT NULL DEFAULT 'open'
  draft INTEGER DEFAULT 1
  labels TEXT
  comments TEXT
  created_at TEXT
  updated_at TEXT
  index (repo, head) c
  index unique (repo, number) c
table notify_deliveries
  id INTEGER PK1
  outbox_id INTEGER NOT NULL
  channel TEXT NOT NULL
  key TEXT NOT NULL
  state TEXT NOT NULL DEFAULT 'pending'
  attempts INTEGER NOT NULL DEFAULT 0
  next_at REAL
  lease_until REAL
  claimed_by TEXT
  last_error TEXT
  created_at TEXT
  delivered_at TEXT
  fk outbox_id -> outbox.id
  index (state, next_at) c
  index unique (key) c
  index unique (outbox_id, channel) c
table outbox
  id INTEGER PK1
  event_id INTEGER NOT NULL
  kinds TEXT NOT NULL
  task_id INTEGER
  error_id TEXT
  payload TEXT
  created_at TEXT NOT NULL
  expanded INTEGER NOT NULL DEFAULT 0
  index (expanded) c
  index unique (event_id) c
table pr_feedback
  id INTEGER PK1
  task_id INTEGER NOT NULL
  number INTEGER
  key TEXT NOT NULL
  kind TEXT NOT NULL
  author TEXT
  path TEXT
  line INTEGER
  state TEXT
  url TEXT
  body TEXT
  decision TEXT NOT NULL
  reason TEXT
  round INTEGER
  created_at TEXT
  fk task_id -> tasks.id
  index unique (task_id, key) c
table pr_feedback_rounds
  id INTEGER PK1
  task_id INTEGER NOT NULL
  round INTEGER NOT NULL
  trigger TEXT NOT NULL
  keys TEXT
  reply_key TEXT
  reply_id TEXT
  head_sha TEXT
  created_at TEXT
  replied_at TEXT
  base_head TEXT
  resets INTEGER
  fk task_id -> tasks.id
  index unique (task_id, round) c
table pr_replies
  id INTEGER PK1
  task_id INTEGER NOT NULL
  key TEXT NOT NULL
  kind TEXT NOT NULL
  round INTEGER
  text TEXT
  reply_id TEXT
  head_sha TEXT
  created_at TEXT
  posted_at TEXT
  fk task_id -> tasks.id
  index (task_id) c
  index unique (key) c
table pr_watch
  task_id INTEGER PK1
  cursor TEXT
  ci_sha TEXT
  ci_state TEXT
  ci_results TEXT
  updated_at TEXT
  fk task_id -> tasks.id
table proofs
  id INTEGER PK1
  task_id INTEGER NOT NULL
  round INTEGER
  head_sha TEXT
  base_sha TEXT
  mode TEXT
  verdict TEXT NOT NULL
  reproduces INTEGER
  reproduces_why TEXT
  command TEXT
  narrowed INTEGER
  test_files TEXT
  flipped TEXT
  passed_on_base TEXT
  skipped TEXT
  removed TEXT
  base_exit INTEGER
  base_status TEXT
  base_tail TEXT
  duration_s REAL
  created_at TEXT
  fk task_id -> tasks.id
  index (task_id, head_sha) c
table prs
  id INTEGER PK1
  task_id INTEGER NOT NULL
  forge TEXT NOT NULL
  repo TEXT NOT NULL
  number INTEGER
  url TEXT
  head_branch TEXT
  head_sha TEXT
  base TEXT
  state TEXT NOT NULL DEFAULT 'open'
  draft INTEGER DEFAULT 1
  title TEXT
  body TEXT
  body_hash TEXT
  created_at TEXT
  updated_at TEXT
  fk task_id -> tasks.id
  index unique (task_id) c
table runners
  id TEXT PK1
  host TEXT NOT NULL
  home TEXT NOT NULL
  pid INTEGER
  pid_start INTEGER
  version TEXT
  started_at TEXT
  heartbeat_at REAL NOT NULL
  clock_offset_s REAL
  stopped_at REAL
  machine TEXT
  scope TEXT
  index unique (id) pk
table steps
  task_id INTEGER PK1
  key TEXT PK2
  kind TEXT NOT NULL
  status TEXT NOT NULL DEFAULT 'pending'
  evidence TEXT
  source TEXT
  head_sha TEXT
  round INTEGER
  closed_at TEXT
  fk task_id -> tasks.id
  index unique (task_id, key) pk
table tasks
  id INTEGER PK1
  error_id TEXT
  conclusion_id INTEGER
  repo TEXT NOT NULL
  base TEXT
  base_sha TEXT
  branch TEXT
  worktree TEXT
  spec_path TEXT
  title TEXT
  state TEXT NOT NULL
  round INTEGER NOT NULL DEFAULT 1
  round_cap INTEGER NOT NULL DEFAULT 5
  blocked_reason TEXT
  failed_reason TEXT
  head_sha TEXT
  pushed_sha TEXT
  claim_owner TEXT
  claim_pid INTEGER
  claim_token TEXT
  lease_until REAL
  created_at TEXT
  updated_at TEXT
  wait_reason TEXT
  fence INTEGER
  claim_runner TEXT
  claim_scope TEXT
  fk conclusion_id -> conclusions.id
  fk error_id -> errors.id
  index (claim_runner) c
  index (id) c
  index (state) c
  index unique (error_id) c
trigger events_no_delete
trigger events_no_update
