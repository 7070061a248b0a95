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
// Test-only routes (not GitHub's): GET /_sim/state, POST /_sim/pulls/:number/state {state, merged}.

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
let nextId = 5000;

const key = (owner, repo, number) => `${owner}/${repo}#${number}`;
const now = () => new Date().toISOString().replace(/\.\d+Z$/, "Z");

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
    comments.set(k, [...(comments.get(k) ?? []), comment]);
    pr.comments += 1;
    return { status: 201, json: comment };
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
      router.get("/_sim/state", (_req, res) => {
        res.json({
          pulls: [...pulls.values()].map((p) => ({
            number: p.number, repo: p.base.repo.full_name, head: p.head.ref, state: p.state,
            draft: p.draft, merged: p.merged, title: p.title, body: p.body,
            labels: p.labels.map((l) => l.name),
          })),
          comments: Object.fromEntries([...comments].map(([k, v]) => [k, v.map((c) => c.body)])),
        });
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
