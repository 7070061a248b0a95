// A GitHub REST simulator for agent's forge tests.
//
// Runs @simulacrum/github-api-simulator (which serves GitHub's official OpenAPI description through
// openapi-backend: every request is validated against the spec and answered 400 if it does not match;
// every response our handlers return as {status, json} is validated too and turned into a 502 if it
// does not match).  We add small stateful handlers for the operations agent uses: pulls (create, list,
// get, update), issue labels and issue comments.  Response bodies start from the spec's own examples,
// so their shape is GitHub's, with our state laid over them.
//
// Usage: GITHUB_SIM_DIR=<folder with node_modules> node server.mjs   (prints "LISTENING <port>")
// Test-only routes (not GitHub's): GET /_sim/state, POST /_sim/pulls/:number/state {state, merged},
// POST /_sim/collaborators {login, permission}.
// Who is calling: a token "user-<login>" acts as <login> (tests play reviewers that way); an installation token
// ("ghs_...", bought as a GitHub App) acts as "<slug>[bot]"; any other token is the agent's own account, "agent-bot".
// GitHub App (configured by POST /_sim/app {id, slug, public_key, installation_id, permissions, lifetime}):
// /app/... and /repos/:o/:r/installation need a JWT signed RS256 by the app's key, with iss = the app id, exp in
// the future and at most 10 minutes ahead, iat not in the future; POST /app/installations/:id/access_tokens sells
// "ghs_" tokens that expire after `lifetime` seconds (of the simulator's clock: POST /_sim/clock {advance} or {reset}) and
// cover only the repositories asked for (POST /_sim/app/revoke drops them all).  Every refused credential is logged
// (GET /_sim/app).
// Reviews, review comments, issue comments, commit statuses and check runs are stateful here too (PR feedback and
// CI, `agent watch pr-feedback`).

import crypto from "node:crypto";
import path from "node:path";
import { pathToFileURL } from "node:url";

const simDir = process.env.GITHUB_SIM_DIR;
if (!simDir) {
  console.error("GITHUB_SIM_DIR is not set");
  process.exit(2);
}
const pkgDir = path.join(simDir, "node_modules", "@simulacrum", "github-api-simulator");
const { simulation } = await import(pathToFileURL(path.join(pkgDir, "dist", "index.mjs")).href);
const fs = await import("node:fs");
const spec = JSON.parse(fs.readFileSync(path.join(pkgDir, "schema", "api.github.com.json"), "utf-8"));
const examples = spec.components.examples;
const clone = (v) => JSON.parse(JSON.stringify(v));

const pulls = new Map(); // "owner/repo#number" -> full pull-request object
const labels = new Map(); // same key -> [label]
const comments = new Map(); // same key -> [comment]
const counters = new Map(); // "owner/repo" -> last number
const reviews = new Map(); // "owner/repo#number" -> [review]
const reviewComments = new Map(); // same key -> [review comment]
const statuses = new Map(); // "owner/repo@sha" -> [status], newest first
const checkRuns = new Map(); // "owner/repo@sha" -> [check run]
const collaborators = new Map(); // login -> permission (admin | write | read | none)
let nextId = 5000;

const ghApp = { id: null, slug: null, publicKey: null, installationId: null, permissions: {}, lifetime: 3600 };
let clockOffset = 0; // seconds added to the real clock (tests move time forward)
const appTokens = new Map(); // "ghs_..." -> { expires, repositories }
const appLog = { issued: 0, rejected: [] };
const simNow = () => Date.now() / 1000 + clockOffset;
const isoAt = (t) => new Date(t * 1000).toISOString().replace(/\.\d+Z$/, "Z");

function jwtProblem(token) {
  const parts = token.split(".");
  if (parts.length !== 3) return "not a JWT";
  let header, claims;
  try {
    header = JSON.parse(Buffer.from(parts[0], "base64url").toString());
    claims = JSON.parse(Buffer.from(parts[1], "base64url").toString());
  } catch {
    return "not a JWT";
  }
  if (header.alg !== "RS256") return `alg ${header.alg} is not RS256`;
  const signed = crypto.verify("RSA-SHA256", Buffer.from(`${parts[0]}.${parts[1]}`), ghApp.publicKey,
    Buffer.from(parts[2], "base64url"));
  if (!signed) return "bad signature";
  if (String(claims.iss) !== String(ghApp.id)) return `iss ${claims.iss} is not the app id`;
  const now = simNow();
  if (typeof claims.exp !== "number" || claims.exp <= now) return "expired";
  if (claims.exp - now > 600) return "exp more than 10 minutes ahead";
  if (typeof claims.iat !== "number" || claims.iat > now + 60) return "iat in the future";
  return null;
}

function refuse(req, res, status, why, message) {
  appLog.rejected.push({ path: req.path, why });
  return res.status(status).json({ message, documentation_url: "https://docs.github.com/rest" });
}

function installationJson(owner) {
  const inst = clone(examples["installation"].value);
  Object.assign(inst, { id: ghApp.installationId, app_id: ghApp.id, app_slug: ghApp.slug, permissions: ghApp.permissions,
    repository_selection: "selected" });
  inst.account = { ...inst.account, login: owner ?? "acme" };
  return inst;
}

const key = (owner, repo, number) => `${owner}/${repo}#${number}`;
const now = () => new Date().toISOString().replace(/\.\d+Z$/, "Z");

function login(request) {
  if (request.simActor) return request.simActor;
  const auth = request.get("authorization") || "";
  const token = auth.replace(/^(bearer|token)\s+/i, "");
  return token.startsWith("user-") ? token.slice(5) : "agent-bot";
}

function userOf(request, name) {
  const user = clone(examples["issue-comment"].value.user);
  const who = name ?? login(request);
  Object.assign(user, { login: who, id: [...who].reduce((h, ch) => (h * 31 + ch.charCodeAt(0)) % 1000000, 7),
    url: `${hostOf(request)}/users/${encodeURIComponent(who)}`,
    html_url: `https://github.example/${encodeURIComponent(who)}`, type: who.endsWith("[bot]") ? "Bot" : user.type });
  return user;
}

function since(request, items) {
  const s = request.query.since;
  return s ? items.filter((c) => c.updated_at >= s) : items;
}

function hostOf(request) {
  return `${request.protocol}://${request.headers.host}`;
}

function fullPull({ owner, repo, number, title, body, head, base, draft, host }) {
  const pr = clone(examples["pull-request"].value);
  const api = `${host}/repos/${owner}/${repo}`;
  const html = `${host}/${owner}/${repo}/pull/${number}`;
  Object.assign(pr, {
    id: nextId++,
    number,
    title,
    body: body ?? null,
    state: "open",
    draft: Boolean(draft),
    url: `${api}/pulls/${number}`,
    html_url: html,
    diff_url: `${html}.diff`,
    patch_url: `${html}.patch`,
    issue_url: `${api}/issues/${number}`,
    commits_url: `${api}/pulls/${number}/commits`,
    review_comments_url: `${api}/pulls/${number}/comments`,
    comments_url: `${api}/issues/${number}/comments`,
    statuses_url: `${api}/statuses/${head.sha}`,
    created_at: now(),
    updated_at: now(),
    closed_at: null,
    merged_at: null,
    merged: false,
    merged_by: null,
    merge_commit_sha: null,
    labels: [],
    milestone: null,
    assignee: null,
    assignees: [],
    requested_reviewers: [],
    requested_teams: [],
    auto_merge: null,
    comments: 0,
  });
  pr.head.ref = head.ref;
  pr.head.sha = head.sha;
  pr.head.label = `${owner}:${head.ref}`;
  pr.base.ref = base;
  pr.base.label = `${owner}:${base}`;
  for (const side of [pr.head, pr.base]) {
    side.repo.name = repo;
    side.repo.full_name = `${owner}/${repo}`;
    side.user.login = owner;
    side.repo.owner.login = owner;
  }
  return pr;
}

function simplePull(pr) {
  const simple = clone(examples["pull-request-simple-items"].value[0]);
  for (const k of Object.keys(simple)) {
    if (k in pr) simple[k] = clone(pr[k]);
  }
  return simple;
}

function validationFailed(message) {
  return {
    status: 422,
    json: {
      message: "Validation Failed",
      documentation_url: "https://docs.github.com/rest/pulls/pulls#create-a-pull-request",
      errors: [{ resource: "PullRequest", code: "custom", message }],
    },
  };
}

function notFound() {
  return { status: 404, json: { message: "Not Found", documentation_url: "https://docs.github.com/rest" } };
}

// Deterministic sha for a branch head: the real one comes from git; tests may pass it in "head_sha" via
// the test-only state route, otherwise a stable fake is used.
function fakeSha(ref) {
  let h = 0;
  for (const ch of ref) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return h.toString(16).padStart(8, "0").repeat(5);
}

function paginate(request, response, items) {
  const perPage = Math.min(parseInt(request.query.per_page ?? "30", 10) || 30, 100);
  const page = Math.max(parseInt(request.query.page ?? "1", 10) || 1, 1);
  const last = Math.max(Math.ceil(items.length / perPage), 1);
  if (page < last) {
    const base = `${hostOf(request)}${request.path}`;
    const qs = (p) => {
      const q = new URLSearchParams({ ...request.query, page: String(p), per_page: String(perPage) });
      return `${base}?${q}`;
    };
    response.setHeader("Link", `<${qs(page + 1)}>; rel="next", <${qs(last)}>; rel="last"`);
  }
  return items.slice((page - 1) * perPage, page * perPage);
}

const handlers = () => ({
  "apps/get-authenticated": async () => {
    const integration = clone(examples["integration"].value);
    Object.assign(integration, { id: ghApp.id, slug: ghApp.slug, name: ghApp.slug, permissions: ghApp.permissions });
    return { status: 200, json: integration };
  },
  "apps/create-installation-access-token": async (context, request) => {
    if (Number(context.request.params.installation_id) !== ghApp.installationId) return notFound();
    const token = `ghs_${crypto.randomBytes(18).toString("hex")}`;
    const expires = Math.floor(simNow()) + ghApp.lifetime;
    appTokens.set(token, { expires, repositories: request.body?.repositories ?? null });
    appLog.issued += 1;
    return { status: 201, json: { token, expires_at: isoAt(expires), permissions: ghApp.permissions,
      repository_selection: "selected" } };
  },
  "pulls/create": async (context, request) => {
    const { owner, repo } = context.request.params;
    const { title, head, base, body, draft } = request.body;
    const ref = head.includes(":") ? head.split(":")[1] : head;
    for (const pr of pulls.values()) {
      if (pr.base.repo.full_name === `${owner}/${repo}` && pr.head.ref === ref && pr.state === "open") {
        return validationFailed(`A pull request already exists for ${owner}:${ref}.`);
      }
    }
    const number = (counters.get(`${owner}/${repo}`) ?? 0) + 1;
    counters.set(`${owner}/${repo}`, number);
    const pr = fullPull({
      owner, repo, number, title, body, base, draft,
      head: { ref, sha: request.get("x-sim-head-sha") || fakeSha(ref) },
      host: hostOf(request),
    });
    pulls.set(key(owner, repo, number), pr);
    return { status: 201, json: pr };
  },
  "pulls/list": async (context, request, response) => {
    const { owner, repo } = context.request.params;
    const state = request.query.state ?? "open";
    const head = request.query.head;
    let items = [...pulls.values()].filter((pr) => pr.base.repo.full_name === `${owner}/${repo}`);
    if (state !== "all") items = items.filter((pr) => pr.state === state);
    if (head) items = items.filter((pr) => pr.head.label === head);
    items.sort((a, b) => b.number - a.number);
    return { status: 200, json: paginate(request, response, items).map(simplePull) };
  },
  "pulls/get": async (context, request) => {
    const { owner, repo, pull_number } = context.request.params;
    const pr = pulls.get(key(owner, repo, pull_number));
    if (pr && request.get("x-sim-corrupt-response")) {
      // proves response validation is live: a wrong type must come back as the simulator's 502
      return { status: 200, json: { ...pr, number: "not-a-number" } };
    }
    return pr ? { status: 200, json: pr } : notFound();
  },
  "pulls/update": async (context, request) => {
    const { owner, repo, pull_number } = context.request.params;
    const pr = pulls.get(key(owner, repo, pull_number));
    if (!pr) return notFound();
    for (const k of ["title", "body", "state"]) if (k in request.body) pr[k] = request.body[k];
    pr.updated_at = now();
    return { status: 200, json: pr };
  },
  "issues/add-labels": async (context, request) => {
    const { owner, repo, issue_number } = context.request.params;
    const k = key(owner, repo, issue_number);
    const pr = pulls.get(k);
    if (!pr) return notFound();
    const names = Array.isArray(request.body) ? request.body : request.body.labels ?? [];
    const have = labels.get(k) ?? [];
    for (const raw of names) {
      const name = typeof raw === "string" ? raw : raw.name;
      if (have.some((l) => l.name === name)) continue;
      const label = clone(examples["label-items"].value[0]);
      Object.assign(label, {
        id: nextId++, name, default: false, description: "",
        url: `${hostOf(request)}/repos/${owner}/${repo}/labels/${encodeURIComponent(name)}`,
      });
      have.push(label);
    }
    labels.set(k, have);
    pr.labels = clone(have);
    return { status: 200, json: have };
  },
  "issues/create-comment": async (context, request) => {
    const { owner, repo, issue_number } = context.request.params;
    const k = key(owner, repo, issue_number);
    const pr = pulls.get(k);
    if (!pr) return notFound();
    const comment = clone(examples["issue-comment"].value);
    const id = nextId++;
    Object.assign(comment, {
      id, body: request.body.body, created_at: now(), updated_at: now(),
      url: `${hostOf(request)}/repos/${owner}/${repo}/issues/comments/${id}`,
      html_url: `${pr.html_url}#issuecomment-${id}`,
      issue_url: pr.issue_url,
    });
    comment.user = userOf(request);
    comment.author_association = "NONE";
    comments.set(k, [...(comments.get(k) ?? []), comment]);
    pr.comments += 1;
    return { status: 201, json: comment };
  },
  "issues/list-comments": async (context, request, response) => {
    const { owner, repo, issue_number } = context.request.params;
    const k = key(owner, repo, issue_number);
    if (!pulls.get(k)) return notFound();
    return { status: 200, json: paginate(request, response, since(request, comments.get(k) ?? [])) };
  },
  "pulls/create-review": async (context, request) => {
    const { owner, repo, pull_number } = context.request.params;
    const k = key(owner, repo, pull_number);
    const pr = pulls.get(k);
    if (!pr) return notFound();
    const event = request.body.event ?? "PENDING";
    const state = { REQUEST_CHANGES: "CHANGES_REQUESTED", COMMENT: "COMMENTED", APPROVE: "APPROVED" }[event] ?? "PENDING";
    const review = clone(examples["pull-request-review"].value);
    const id = nextId++;
    Object.assign(review, {
      id, node_id: `PRR_${id}`, user: userOf(request), body: request.body.body ?? "", state,
      html_url: `${pr.html_url}#pullrequestreview-${id}`, pull_request_url: pr.url,
      commit_id: request.body.commit_id ?? pr.head.sha, submitted_at: state === "PENDING" ? undefined : now(),
      author_association: "COLLABORATOR",
    });
    if (state === "PENDING") delete review.submitted_at;
    review._links.html.href = review.html_url;
    review._links.pull_request.href = pr.url;
    reviews.set(k, [...(reviews.get(k) ?? []), review]);
    for (const c of request.body.comments ?? []) {
      const comment = clone(examples["pull-request-review-comment"].value);
      const cid = nextId++;
      Object.assign(comment, {
        id: cid, node_id: `PRRC_${cid}`, pull_request_review_id: id, user: userOf(request), body: c.body,
        path: c.path, line: c.line, original_line: c.line, side: "RIGHT", position: c.position ?? 1,
        original_position: 1, subject_type: c.line ? "line" : "file",
        commit_id: review.commit_id, original_commit_id: review.commit_id, created_at: now(), updated_at: now(),
        url: `${hostOf(request)}/repos/${owner}/${repo}/pulls/comments/${cid}`,
        html_url: `${pr.html_url}#discussion_r${cid}`, pull_request_url: pr.url,
      });
      // absent, not null: the description's enums and integers do not admit null here
      for (const f of ["in_reply_to_id", "start_line", "original_start_line", "start_side"]) delete comment[f];
      if (!c.line) { delete comment.line; delete comment.original_line; }
      comment._links.self.href = comment.url;
      comment._links.html.href = comment.html_url;
      comment._links.pull_request.href = pr.url;
      reviewComments.set(k, [...(reviewComments.get(k) ?? []), comment]);
    }
    return { status: 200, json: review };
  },
  "pulls/list-reviews": async (context, request, response) => {
    const { owner, repo, pull_number } = context.request.params;
    return { status: 200, json: paginate(request, response, reviews.get(key(owner, repo, pull_number)) ?? []) };
  },
  "pulls/list-review-comments": async (context, request, response) => {
    const { owner, repo, pull_number } = context.request.params;
    const items = since(request, reviewComments.get(key(owner, repo, pull_number)) ?? []);
    return { status: 200, json: paginate(request, response, items) };
  },
  "repos/get-collaborator-permission-level": async (context, request) => {
    const { username } = context.request.params;
    const permission = username === "agent-bot" ? "write" : collaborators.get(username);
    if (!permission) return notFound();
    const body = clone(examples["repository-collaborator-permission-response-if-user-has-admin-permissions"].value);
    body.permission = permission;
    body.role_name = permission;
    body.user = { ...body.user, login: username, role_name: permission };
    return { status: 200, json: body };
  },
  "repos/create-commit-status": async (context, request) => {
    const { owner, repo, sha } = context.request.params;
    const status = clone(examples["status"].value);
    const id = nextId++;
    Object.assign(status, {
      id, node_id: `SC_${id}`, state: request.body.state, description: request.body.description ?? null,
      target_url: request.body.target_url ?? null, context: request.body.context ?? "default",
      created_at: now(), updated_at: now(), url: `${hostOf(request)}/repos/${owner}/${repo}/statuses/${sha}`,
      creator: userOf(request),
    });
    const k = `${owner}/${repo}@${sha}`;
    statuses.set(k, [status, ...(statuses.get(k) ?? [])]);
    return { status: 201, json: status };
  },
  "repos/list-commit-statuses-for-ref": async (context, request, response) => {
    const { owner, repo, ref } = context.request.params;
    return { status: 200, json: paginate(request, response, statuses.get(`${owner}/${repo}@${ref}`) ?? []) };
  },
  "checks/create": async (context, request) => {
    const { owner, repo } = context.request.params;
    const b = request.body;
    const run = clone(examples["check-run"].value);
    const id = nextId++;
    Object.assign(run, {
      id, node_id: `CR_${id}`, name: b.name, head_sha: b.head_sha, status: b.status ?? (b.conclusion ? "completed" : "queued"),
      conclusion: b.conclusion ?? null, details_url: b.details_url ?? null, external_id: b.external_id ?? "",
      started_at: now(), completed_at: b.conclusion ? now() : null,
      url: `${hostOf(request)}/repos/${owner}/${repo}/check-runs/${id}`,
      html_url: `https://github.example/${owner}/${repo}/runs/${id}`,
      output: { ...run.output, title: b.output?.title ?? null, summary: b.output?.summary ?? null, text: null,
        annotations_count: 0 },
      pull_requests: [],
    });
    const k = `${owner}/${repo}@${b.head_sha}`;
    checkRuns.set(k, [...(checkRuns.get(k) ?? []), run]);
    return { status: 201, json: run };
  },
  "checks/list-for-ref": async (context, request, response) => {
    const { owner, repo, ref } = context.request.params;
    const runs = checkRuns.get(`${owner}/${repo}@${ref}`) ?? [];
    const latest = new Map();
    for (const r of runs) latest.set(r.name, r); // filter=latest (the default): the newest run per name
    const items = request.query.filter === "all" ? runs : [...latest.values()];
    return { status: 200, json: { total_count: items.length, check_runs: paginate(request, response, items) } };
  },
});

const initialState = {
  users: [{ login: "acme", organizations: ["acme"] }],
  organizations: [{ login: "acme" }],
  repositories: [{ owner: "acme", name: "widgets" }],
  branches: [{ name: "main" }],
  blobs: [],
};

const app = simulation({
  initialState,
  extend: {
    openapiHandlers: handlers,
    extendRouter: (router) => {
      // credentials first (registered before the OpenAPI routes): the app's JWT, then installation tokens
      router.use((req, res, next) => {
        if (req.path.startsWith("/_sim")) return next();
        const token = (req.get("authorization") || "").replace(/^(bearer|token)\s+/i, "");
        if (/^\/app(\/|$)/.test(req.path) || /^\/repos\/[^/]+\/[^/]+\/installation$/.test(req.path)) {
          const why = ghApp.id ? jwtProblem(token) : "no GitHub App configured";
          return why ? refuse(req, res, 401, why, "A JSON web token could not be decoded") : next();
        }
        if (token.startsWith("ghs_")) {
          const t = appTokens.get(token);
          if (!t) return refuse(req, res, 401, "unknown installation token", "Bad credentials");
          if (t.expires <= simNow()) return refuse(req, res, 401, "expired installation token", "Bad credentials");
          const m = req.path.match(/^\/repos\/[^/]+\/([^/]+)/);
          if (m && t.repositories && !t.repositories.includes(decodeURIComponent(m[1]))) {
            return refuse(req, res, 404, "repository not covered by the token", "Not Found");
          }
          req.simActor = `${ghApp.slug}[bot]`;
        }
        return next();
      });
      // The description's `installation` schema does not compile in ajv ("nullable" without "type"), so these two
      // answers (the spec's own example with our state laid over it) are served here, after the JWT check above.
      router.get("/app/installations/:installation_id", (req, res) => {
        if (Number(req.params.installation_id) !== ghApp.installationId) return res.status(404).json({ message: "Not Found" });
        return res.json(installationJson());
      });
      router.get("/repos/:owner/:repo/installation", (req, res) => res.json(installationJson(req.params.owner)));
      router.post("/_sim/app", (req, res) => {
        Object.assign(ghApp, { id: req.body.id, slug: req.body.slug, publicKey: req.body.public_key,
          installationId: req.body.installation_id, permissions: req.body.permissions ?? {},
          lifetime: req.body.lifetime ?? 3600 });
        res.json({ ok: true });
      });
      router.post("/_sim/app/revoke", (_req, res) => {
        appTokens.clear(); // an admin revoked the installation's tokens
        res.json({ ok: true });
      });
      router.post("/_sim/clock", (req, res) => {
        clockOffset = req.body.reset ? 0 : clockOffset + Number(req.body.advance ?? 0);
        res.json({ now: simNow() });
      });
      router.get("/_sim/app", (_req, res) => {
        res.json({ issued: appLog.issued, rejected: appLog.rejected, now: simNow() });
      });
      router.get("/_sim/state", (_req, res) => {
        res.json({
          pulls: [...pulls.values()].map((p) => ({
            number: p.number, repo: p.base.repo.full_name, head: p.head.ref, state: p.state,
            draft: p.draft, merged: p.merged, title: p.title, body: p.body,
            labels: p.labels.map((l) => l.name),
          })),
          comments: Object.fromEntries([...comments].map(([k, v]) => [k, v.map((c) => c.body)])),
          comment_authors: Object.fromEntries([...comments].map(([k, v]) => [k, v.map((c) => c.user.login)])),
        });
      });
      router.post("/_sim/collaborators", (req, res) => {
        collaborators.set(req.body.login, req.body.permission ?? "write");
        res.json({ ok: true });
      });
      router.post("/_sim/pulls/:owner/:repo/:number/state", (req, res) => {
        const pr = pulls.get(key(req.params.owner, req.params.repo, req.params.number));
        if (!pr) return res.status(404).json({ message: "Not Found" });
        pr.state = req.body.state ?? pr.state;
        if (req.body.draft !== undefined) pr.draft = req.body.draft;
        if (req.body.merged) {
          pr.merged = true;
          pr.merged_at = now();
          pr.state = "closed";
        }
        if (pr.state === "closed") pr.closed_at = now();
        res.json({ ok: true });
      });
    },
  },
});

const listening = await app.listen(0, "127.0.0.1");
console.log(`LISTENING ${listening.port}`);
