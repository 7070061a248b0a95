"""The Gitea API v1 endpoints agent uses, as a schema the simulator checks every request and answer against.

Derived from Gitea's official API description:

    go-gitea/gitea  templates/swagger/v1_json.tmpl  @ 67ce9ca11034c00ea81f36f0e574529079534071
    (Swagger 2.0, 666,646 characters; basePath "{{AppSubUrl}}/api/v1"; securityDefinitions include
    AuthorizationHeaderToken = header "Authorization" with "token <t>")

Copied from it, per operation: the path template, the method, the operationId, the path and query parameters
(name, type, enum), the body definition and the declared response statuses with their schema.  Per definition:
the property names and their types, and ``required`` where the description has it.  Forgejo publishes an OpenAPI
v2 file of the same shape at the same paths for these endpoints.

Choices made while deriving (the description cannot express them):
- Swagger 2.0 has no ``nullable``; Gitea's Go structs serialise nil pointers (``*time.Time``, ``*User``,
  ``*Milestone``) as ``null``, so exactly those properties accept null here.  Everything else is strict.
- Every object refuses properties the description does not name (``additionalProperties: false``), in requests
  AND in the simulator's answers, so neither side can drift from the description unnoticed.
- Error statuses Gitea declares through ``#/responses/notFound|forbidden|validationError`` carry no body schema
  in the description (headers only); they are ``None`` here (any body).  ``#/responses/error`` is ``APIError``.
- ``{head*}`` marks Gitea's catch-all route parameter (``/pulls/{base}/*``): a head branch may contain slashes.
- The ``draft`` property of ``PullRequest`` is not in this version of the description (newer Gitea adds it); drafts
  are told by the ``WIP:`` title prefix, which is how this version marks them.
"""

from . import schema_list as _list, schema_obj as _obj, schema_ref as _ref

BASE_PATH = "/api/v1"
SOURCE = ("go-gitea/gitea", "templates/swagger/v1_json.tmpl", "67ce9ca11034c00ea81f36f0e574529079534071")

_S = {"type": "string"}
_I = {"type": "integer"}
_B = {"type": "boolean"}
_DT = {"type": "string", "format": "date-time"}
_DT_NULL = {"type": ["string", "null"], "format": "date-time"}


DEFINITIONS = {
    "APIError": _obj({"message": _S, "url": _S}),
    "User": _obj({
        "active": _B, "avatar_url": _S, "created": _DT, "description": _S, "email": {"type": "string"},
        "followers_count": _I, "following_count": _I, "full_name": _S, "html_url": _S, "id": _I, "is_admin": _B,
        "language": _S, "last_login": _DT, "location": _S, "login": _S, "login_name": _S, "prohibit_login": _B,
        "restricted": _B, "source_id": _I, "starred_repos_count": _I, "visibility": _S, "website": _S}),
    "Label": _obj({"color": _S, "description": _S, "exclusive": _B, "id": _I, "is_archived": _B, "name": _S,
                   "url": _S}),
    "CreateLabelOption": _obj({"color": _S, "description": _S, "exclusive": _B, "is_archived": _B, "name": _S},
                              required=("name", "color")),
    "IssueLabelsOption": _obj({"labels": {"type": "array", "items": _I}}),
    "Milestone": _obj({"closed_at": _DT_NULL, "closed_issues": _I, "created_at": _DT, "description": _S,
                       "due_on": _DT_NULL, "id": _I, "open_issues": _I, "state": _S, "title": _S,
                       "updated_at": _DT_NULL}),
    "PRBranchInfo": _obj({"label": _S, "ref": _S, "repo": _ref("Repository", nullable=True), "repo_id": _I,
                          "sha": _S}),
    # The Repository definition has ~70 properties; the simulator answers with the few below, all of which
    # the description names with these types (a subset is valid: none is required).
    "Repository": _obj({"id": _I, "name": _S, "full_name": _S, "html_url": _S, "clone_url": _S, "ssh_url": _S,
                        "default_branch": _S, "private": _B, "owner": _ref("User", nullable=True)}),
    "StateType": {"type": "string"},
    "PullRequest": _obj({
        "allow_maintainer_edit": _B, "assignee": _ref("User", nullable=True),
        "assignees": {"type": ["array", "null"], "items": _ref("User")}, "base": _ref("PRBranchInfo"),
        "body": _S, "closed_at": _DT_NULL, "comments": _I, "created_at": _DT, "diff_url": _S,
        "due_date": _DT_NULL, "head": _ref("PRBranchInfo"), "html_url": _S, "id": _I, "is_locked": _B,
        "labels": {"type": "array", "items": _ref("Label")}, "merge_base": _S,
        "merge_commit_sha": {"type": ["string", "null"]}, "mergeable": _B, "merged": _B, "merged_at": _DT_NULL,
        "merged_by": _ref("User", nullable=True), "milestone": _ref("Milestone", nullable=True), "number": _I,
        "patch_url": _S, "pin_order": _I, "requested_reviewers": {"type": ["array", "null"], "items": _ref("User")},
        "state": _ref("StateType"), "title": _S, "updated_at": _DT_NULL, "url": _S, "user": _ref("User")}),
    "CreatePullRequestOption": _obj({
        "assignee": _S, "assignees": {"type": "array", "items": _S}, "base": _S, "body": _S, "due_date": _DT,
        "head": _S, "labels": {"type": "array", "items": _I}, "milestone": _I, "title": _S}),
    "EditPullRequestOption": _obj({
        "allow_maintainer_edit": _B, "assignee": _S, "assignees": {"type": "array", "items": _S}, "base": _S,
        "body": _S, "due_date": _DT, "labels": {"type": "array", "items": _I}, "milestone": _I, "state": _S,
        "title": _S, "unset_due_date": _B}),
    "Comment": _obj({
        "assets": {"type": "array"}, "body": _S, "created_at": _DT, "html_url": _S, "id": _I, "issue_url": _S,
        "original_author": _S, "original_author_id": _I, "pull_request_url": _S, "updated_at": _DT,
        "user": _ref("User")}),
    "CreateIssueCommentOption": _obj({"body": _S}, required=("body",)),
    "ReviewStateType": {"type": "string"},
    "PullReview": _obj({
        "body": _S, "comments_count": _I, "commit_id": _S, "dismissed": _B, "html_url": _S, "id": _I,
        "official": _B, "pull_request_url": _S, "stale": _B, "state": _ref("ReviewStateType"),
        "submitted_at": _DT, "team": {"type": ["object", "null"]}, "updated_at": _DT, "user": _ref("User")}),
    "PullReviewComment": _obj({
        "body": _S, "commit_id": _S, "created_at": _DT, "diff_hunk": _S, "html_url": _S, "id": _I,
        "original_commit_id": _S, "original_position": _I, "path": _S, "position": _I,
        "pull_request_review_id": _I, "pull_request_url": _S, "resolver": _ref("User", nullable=True),
        "updated_at": _DT, "user": _ref("User")}),
    "RepoCollaboratorPermission": _obj({"permission": _S, "role_name": _S, "user": _ref("User")}),
    "CommitStatusState": {"type": "string"},
    "CommitStatus": _obj({
        "context": _S, "created_at": _DT, "creator": _ref("User", nullable=True), "description": _S, "id": _I,
        "status": _ref("CommitStatusState"), "target_url": _S, "updated_at": _DT, "url": _S}),
    "CreateStatusOption": _obj({"context": _S, "description": _S, "state": _ref("CommitStatusState"),
                                "target_url": _S}),
}

_OR = {"owner": _S, "repo": _S}
_PAGE = {"page": _I, "limit": _I}
NOT_FOUND = None          # "#/responses/notFound": no body schema in the description
FORBIDDEN = None          # "#/responses/forbidden"
VALIDATION = None         # "#/responses/validationError"
ERROR = _ref("APIError")  # "#/responses/error"

OPERATIONS = [
    {"id": "userGetCurrent", "method": "GET", "path": "/user",
     "responses": {"200": _ref("User")}},
    {"id": "repoListPullRequests", "method": "GET", "path": "/repos/{owner}/{repo}/pulls",
     "path_params": _OR,
     "query": {"state": {"type": "string", "enum": ["closed", "open", "all"]},
               "sort": {"type": "string", "enum": ["oldest", "recentupdate", "leastupdate", "mostcomment",
                                                   "leastcomment", "priority"]},
               "milestone": _I, "labels": _I, **_PAGE},
     "responses": {"200": _list("PullRequest"), "404": NOT_FOUND}},
    {"id": "repoCreatePullRequest", "method": "POST", "path": "/repos/{owner}/{repo}/pulls",
     "path_params": _OR, "body": _ref("CreatePullRequestOption"),
     "responses": {"201": _ref("PullRequest"), "403": FORBIDDEN, "404": NOT_FOUND, "409": ERROR,
                   "422": VALIDATION, "423": None}},
    {"id": "repoGetPullRequestByBaseHead", "method": "GET", "path": "/repos/{owner}/{repo}/pulls/{base}/{head*}",
     "path_params": {**_OR, "base": _S, "head": _S},
     "responses": {"200": _ref("PullRequest"), "404": NOT_FOUND}},
    {"id": "repoGetPullRequest", "method": "GET", "path": "/repos/{owner}/{repo}/pulls/{index}",
     "path_params": {**_OR, "index": _I},
     "responses": {"200": _ref("PullRequest"), "404": NOT_FOUND}},
    {"id": "repoEditPullRequest", "method": "PATCH", "path": "/repos/{owner}/{repo}/pulls/{index}",
     "path_params": {**_OR, "index": _I}, "body": _ref("EditPullRequestOption"),
     "responses": {"201": _ref("PullRequest"), "403": FORBIDDEN, "404": NOT_FOUND, "409": ERROR, "412": ERROR,
                   "422": VALIDATION}},
    {"id": "repoPullRequestIsMerged", "method": "GET", "path": "/repos/{owner}/{repo}/pulls/{index}/merge",
     "path_params": {**_OR, "index": _I}, "responses": {"204": None, "404": None}},
    {"id": "issueGetComments", "method": "GET", "path": "/repos/{owner}/{repo}/issues/{index}/comments",
     "path_params": {**_OR, "index": _I}, "query": {"since": _S, "before": _S},
     "responses": {"200": _list("Comment"), "404": NOT_FOUND}},
    {"id": "issueCreateComment", "method": "POST", "path": "/repos/{owner}/{repo}/issues/{index}/comments",
     "path_params": {**_OR, "index": _I}, "body": _ref("CreateIssueCommentOption"), "body_required": True,
     "responses": {"201": _ref("Comment"), "403": FORBIDDEN, "404": NOT_FOUND, "423": None}},
    {"id": "issueListLabels", "method": "GET", "path": "/repos/{owner}/{repo}/labels",
     "path_params": _OR, "query": _PAGE,
     "responses": {"200": _list("Label"), "404": NOT_FOUND}},
    {"id": "issueCreateLabel", "method": "POST", "path": "/repos/{owner}/{repo}/labels",
     "path_params": _OR, "body": _ref("CreateLabelOption"), "body_required": True,
     "responses": {"201": _ref("Label"), "404": NOT_FOUND, "422": VALIDATION}},
    {"id": "issueAddLabel", "method": "POST", "path": "/repos/{owner}/{repo}/issues/{index}/labels",
     "path_params": {**_OR, "index": _I}, "body": _ref("IssueLabelsOption"),
     "responses": {"200": _list("Label"), "403": FORBIDDEN, "404": NOT_FOUND}},
    {"id": "repoListPullReviews", "method": "GET", "path": "/repos/{owner}/{repo}/pulls/{index}/reviews",
     "path_params": {**_OR, "index": _I}, "query": _PAGE,
     "responses": {"200": _list("PullReview"), "404": NOT_FOUND}},
    {"id": "repoGetPullReviewComments", "method": "GET",
     "path": "/repos/{owner}/{repo}/pulls/{index}/reviews/{id}/comments",
     "path_params": {**_OR, "index": _I, "id": _I},
     "responses": {"200": _list("PullReviewComment"), "404": NOT_FOUND}},
    {"id": "repoGetRepoPermissions", "method": "GET",
     "path": "/repos/{owner}/{repo}/collaborators/{collaborator}/permission",
     "path_params": {**_OR, "collaborator": _S},
     "responses": {"200": _ref("RepoCollaboratorPermission"), "403": FORBIDDEN, "404": NOT_FOUND}},
    {"id": "repoListStatuses", "method": "GET", "path": "/repos/{owner}/{repo}/statuses/{sha}",
     "path_params": {**_OR, "sha": _S},
     "query": {"sort": {"type": "string", "enum": ["oldest", "recentupdate", "leastupdate", "leastindex",
                                                   "highestindex"]},
               "state": {"type": "string", "enum": ["pending", "success", "error", "failure", "warning"]}, **_PAGE},
     "responses": {"200": _list("CommitStatus"), "400": ERROR, "404": NOT_FOUND}},
    {"id": "repoCreateStatus", "method": "POST", "path": "/repos/{owner}/{repo}/statuses/{sha}",
     "path_params": {**_OR, "sha": _S}, "body": _ref("CreateStatusOption"),
     "responses": {"201": _ref("CommitStatus"), "400": ERROR, "404": NOT_FOUND}},
]
