"""The GitLab REST API v4 endpoints agent uses, as a schema the simulator checks every request and answer against.

Sources (GitLab's own API description and reference pages):

1. gitlabhq/gitlabhq  doc/api/openapi/openapi_v3.yaml  @ 045bf8777ea893e770b49d420febaeb7bf89e24a
   (OpenAPI 3.0.0, ``info.version: '19.5'``, 3,912,294 characters).  Read for the merge request operations
   (tag "Merge requests", around character 1,375,000-1,423,000): the paths
   ``/api/v4/projects/{id}/merge_requests`` (get, post) and ``.../merge_requests/{merge_request_iid}`` (get, put),
   their operationIds, the path parameters (``id``: string or integer, "The ID or URL-encoded path of the
   project"; ``merge_request_iid``: integer), the list's query parameters (``source_branch``, ``target_branch``,
   ``state``, ``page`` default 1, ``per_page`` default 20, ...) and the declared statuses (post: 201 400 401 404
   409 422; get: 200 400 404; put: 200 400 404 409 422).  Also read there (tag "Members", around character
   1,445,000-1,452,000): ``/api/v4/projects/{id}/members/all/{user_id}`` (get,
   ``getApiV4ProjectsIdMembersAllUserId``: "Returns direct members and members inherited or invited through
   ancestor groups"; ``user_id`` integer; 200 ``APIEntitiesMember``, 400, 404).  A 401 for a missing or wrong
   token is answered before any operation (and so is not checked per operation).
2. Where that file could not be read for an endpoint or an entity, GitLab's REST reference pages in the same
   repository, ``doc/api/*.md`` (the pages the OpenAPI tags link to): ``merge_requests.md`` (the
   ``RequestBody`` of create/update and the merge request entity's fields), ``notes.md`` (merge request notes),
   ``discussions.md`` (threads, ``DiffNote`` positions), ``commits.md`` (commit statuses), ``pipelines.md``,
   ``members.md`` (``members/all/:user_id``, access levels), ``users.md`` (``GET /user``, ``GET /users``) and
   ``rest/_index.md`` (pagination headers), ``administration/settings/user_and_ip_rate_limits.md`` (429 headers).
   The 3.9 M-character OpenAPI file is generated from the same Grape entities these pages document; its notes,
   discussions, statuses, pipelines and users operations (and the ``components/schemas`` the operations above
   reference: ``APIEntitiesMergeRequest``, ``APIEntitiesMember``, ``RequestBody_d48c5188ea01``,
   ``RequestBody_e430517b7941``) could not be located with the paged reader available here (16,000 characters a
   read, paths in the file's own order), so their fields come from the pages above.

Choices made while deriving:
- Only the properties agent reads or sends are listed for entities, with their documented types; objects refuse
  properties not listed (``additionalProperties: false``) in requests AND in the simulator's answers.
- Documented-nullable fields (``merged_at``, ``closed_at``, ``merge_commit_sha``, ``position``, ``type`` ...) accept
  null.  Error answers (``{"message": ...}`` or ``{"error": ...}``) are ``None`` (any body): the description
  declares their statuses without a schema.
- Path templates keep GitLab's parameter names; the project id is one URL-encoded segment (``acme%2Fwidgets``).
"""

from . import schema_list as _list, schema_obj as _obj, schema_ref as _ref

BASE_PATH = "/api/v4"
SOURCE = ("gitlabhq/gitlabhq", "doc/api/openapi/openapi_v3.yaml", "045bf8777ea893e770b49d420febaeb7bf89e24a")

_S = {"type": "string"}
_SN = {"type": ["string", "null"]}
_I = {"type": "integer"}
_B = {"type": "boolean"}
_DT = {"type": "string", "format": "date-time"}
_DTN = {"type": ["string", "null"], "format": "date-time"}


_STR_OR_LIST = {"anyOf": [_S, {"type": "array", "items": _S}]}   # "Comma-separated label names" or an array

DEFINITIONS = {
    "UserBasic": _obj({"id": _I, "username": _S, "name": _S, "state": _S, "locked": _B, "avatar_url": _SN,
                       "web_url": _S, "public_email": _SN}),
    "User": _obj({"id": _I, "username": _S, "name": _S, "state": _S, "locked": _B, "avatar_url": _SN,
                  "web_url": _S, "created_at": _DT, "bio": _S, "public_email": _SN, "email": _S, "is_admin": _B,
                  "bot": _B}),
    "Member": _obj({"id": _I, "username": _S, "name": _S, "state": _S, "locked": _B, "avatar_url": _SN,
                    "web_url": _S, "access_level": {"type": "integer", "enum": [0, 5, 10, 15, 20, 30, 40, 50, 60]},
                    "created_at": _DT, "expires_at": _DTN, "membership_state": _S}),
    "DiffRefs": _obj({"base_sha": _SN, "head_sha": _SN, "start_sha": _SN}),
    "References": _obj({"short": _S, "relative": _S, "full": _S}),
    "PipelineBasic": _obj({"id": _I, "iid": _I, "project_id": _I, "sha": _S, "ref": _S, "status": _S,
                           "source": _S, "created_at": _DT, "updated_at": _DT, "web_url": _S}),
    "MergeRequest": _obj({
        "id": _I, "iid": _I, "project_id": _I, "title": _S, "description": _SN,
        "state": {"type": "string", "enum": ["opened", "closed", "locked", "merged"]},
        "created_at": _DT, "updated_at": _DT, "merged_at": _DTN, "closed_at": _DTN,
        "merged_by": _ref("UserBasic", nullable=True), "merge_user": _ref("UserBasic", nullable=True),
        "closed_by": _ref("UserBasic", nullable=True), "target_branch": _S, "source_branch": _S,
        "source_project_id": _I, "target_project_id": _I, "author": _ref("UserBasic"),
        "assignees": _list("UserBasic"), "reviewers": _list("UserBasic"), "labels": {"type": "array", "items": _S},
        "draft": _B, "work_in_progress": _B, "merge_status": _S, "detailed_merge_status": _S, "sha": _SN,
        "merge_commit_sha": _SN, "squash_commit_sha": _SN, "user_notes_count": _I,
        "should_remove_source_branch": {"type": ["boolean", "null"]}, "force_remove_source_branch": _B,
        "reference": _S, "references": _ref("References"), "web_url": _S, "squash": _B,
        "has_conflicts": _B, "blocking_discussions_resolved": _B, "diff_refs": _ref("DiffRefs", nullable=True),
        "head_pipeline": _ref("PipelineBasic", nullable=True)}),
    # POST /projects/:id/merge_requests (RequestBody_d48c5188ea01 in openapi_v3; fields per merge_requests.md)
    "CreateMergeRequest": _obj({
        "title": _S, "source_branch": _S, "target_branch": _S, "target_project_id": _I, "assignee_id": _I,
        "assignee_ids": {"type": "array", "items": _I}, "reviewer_ids": {"type": "array", "items": _I},
        "description": {"type": "string", "maxLength": 1048576}, "labels": _STR_OR_LIST, "milestone_id": _I,
        "remove_source_branch": _B, "allow_collaboration": _B, "allow_maintainer_to_push": _B, "squash": _B,
        "merge_after": _S}, required=("title", "source_branch", "target_branch")),
    # PUT /projects/:id/merge_requests/:merge_request_iid (RequestBody_e430517b7941; at least one field)
    "UpdateMergeRequest": {**_obj({
        "title": _S, "description": {"type": "string", "maxLength": 1048576}, "target_branch": _S,
        "state_event": {"type": "string", "enum": ["close", "reopen"]}, "labels": _STR_OR_LIST,
        "add_labels": _STR_OR_LIST, "remove_labels": _STR_OR_LIST, "assignee_id": _I,
        "assignee_ids": {"type": "array", "items": _I}, "reviewer_ids": {"type": "array", "items": _I},
        "milestone_id": _I, "remove_source_branch": _B, "squash": _B, "discussion_locked": _B,
        "allow_collaboration": _B, "allow_maintainer_to_push": _B, "merge_after": _S}), "minProperties": 1},
    "Position": _obj({"base_sha": _S, "start_sha": _S, "head_sha": _S, "old_path": _SN, "new_path": _SN,
                      "position_type": {"type": "string", "enum": ["text", "image", "file"]},
                      "old_line": {"type": ["integer", "null"]}, "new_line": {"type": ["integer", "null"]},
                      "line_range": {"type": ["object", "null"]}}),
    "Note": _obj({
        "id": _I, "type": {"type": ["string", "null"], "enum": ["DiffNote", "DiscussionNote", "Note", None]},
        "body": _S, "attachment": _SN, "author": _ref("UserBasic"), "created_at": _DT, "updated_at": _DT,
        "system": _B, "noteable_id": _I, "noteable_type": _S, "project_id": _I, "noteable_iid": _I,
        "resolvable": _B, "resolved": _B, "resolved_by": _ref("UserBasic", nullable=True), "resolved_at": _DTN,
        "confidential": _B, "internal": _B, "position": _ref("Position", nullable=True)}),
    "Discussion": _obj({"id": _S, "individual_note": _B, "notes": _list("Note")}),
    "CreateNote": _obj({"body": {"type": "string", "maxLength": 1000000}, "internal": _B, "created_at": _S,
                        "merge_request_diff_head_sha": _S}, required=("body",)),
    "CommitStatus": _obj({
        "id": _I, "sha": _S, "ref": _SN, "status": {"type": "string", "enum": [
            "created", "waiting_for_resource", "preparing", "pending", "running", "success", "failed",
            "canceling", "canceled", "skipped", "manual", "scheduled"]},
        "name": _S, "target_url": _SN, "description": _SN, "created_at": _DT, "started_at": _DTN,
        "finished_at": _DTN, "allow_failure": _B, "coverage": {"type": ["number", "null"]},
        "author": _ref("UserBasic"), "pipeline_id": {"type": ["integer", "null"]}}),
}

_ID = {"id": {"type": "string"}}                                   # one URL-encoded segment
_MR = {**_ID, "merge_request_iid": _I}
_PAGE = {"page": _I, "per_page": _I}
ANY = None                                                          # a declared status without a body schema

OPERATIONS = [
    {"id": "getApiV4User", "method": "GET", "path": "/user", "responses": {"200": _ref("User"), "401": ANY}},
    {"id": "getApiV4Users", "method": "GET", "path": "/users",
     "query": {"username": _S, "search": _S, "active": _B, **_PAGE},
     "responses": {"200": _list("UserBasic"), "401": ANY}},
    {"id": "getApiV4ProjectsIdMergeRequests", "method": "GET", "path": "/projects/{id}/merge_requests",
     "path_params": _ID,
     "query": {"state": {"type": "string", "enum": ["opened", "closed", "locked", "merged", "all"]},
               "source_branch": _S, "target_branch": _S, "order_by": _S, "sort": {"type": "string",
                                                                                 "enum": ["asc", "desc"]},
               "draft": _B, "wip": {"type": "string", "enum": ["yes", "no"]}, "author_username": _S, **_PAGE},
     "responses": {"200": _list("MergeRequest"), "400": ANY, "404": ANY}},
    {"id": "postApiV4ProjectsIdMergeRequests", "method": "POST", "path": "/projects/{id}/merge_requests",
     "path_params": _ID, "body": _ref("CreateMergeRequest"), "body_required": True,
     # 403: not declared by the OpenAPI file; the handler (lib/api/merge_requests.rb) calls
     # ``authorize! :create_merge_request_from`` first, which answers 403 to a user below Developer.
     "responses": {"201": _ref("MergeRequest"), "400": ANY, "401": ANY, "403": ANY, "404": ANY, "409": ANY,
                   "422": ANY}},
    {"id": "getApiV4ProjectsIdMergeRequestsMergeRequestIid", "method": "GET",
     "path": "/projects/{id}/merge_requests/{merge_request_iid}", "path_params": _MR,
     "query": {"render_html": _B, "include_diverged_commits_count": _B, "include_rebase_in_progress": _B},
     "responses": {"200": _ref("MergeRequest"), "400": ANY, "404": ANY}},
    {"id": "putApiV4ProjectsIdMergeRequestsMergeRequestIid", "method": "PUT",
     "path": "/projects/{id}/merge_requests/{merge_request_iid}", "path_params": _MR,
     "body": _ref("UpdateMergeRequest"), "body_required": True,
     "responses": {"200": _ref("MergeRequest"), "400": ANY, "404": ANY, "409": ANY, "422": ANY}},
    {"id": "getApiV4ProjectsIdMergeRequestsNoteableIdNotes", "method": "GET",
     "path": "/projects/{id}/merge_requests/{merge_request_iid}/notes", "path_params": _MR,
     "query": {"order_by": {"type": "string", "enum": ["created_at", "updated_at"]},
               "sort": {"type": "string", "enum": ["asc", "desc"]}, **_PAGE},
     "responses": {"200": _list("Note"), "401": ANY, "404": ANY}},
    {"id": "postApiV4ProjectsIdMergeRequestsNoteableIdNotes", "method": "POST",
     "path": "/projects/{id}/merge_requests/{merge_request_iid}/notes", "path_params": _MR,
     "body": _ref("CreateNote"), "body_required": True,
     "responses": {"201": _ref("Note"), "400": ANY, "401": ANY, "403": ANY, "404": ANY}},
    {"id": "getApiV4ProjectsIdMergeRequestsNoteableIdDiscussions", "method": "GET",
     "path": "/projects/{id}/merge_requests/{merge_request_iid}/discussions", "path_params": _MR, "query": _PAGE,
     "responses": {"200": _list("Discussion"), "401": ANY, "404": ANY}},
    {"id": "getApiV4ProjectsIdMembersAllUserId", "method": "GET", "path": "/projects/{id}/members/all/{user_id}",
     "path_params": {**_ID, "user_id": _I},                                   # from openapi_v3 (tag Members)
     "responses": {"200": _ref("Member"), "400": ANY, "404": ANY}},
    {"id": "getApiV4ProjectsIdRepositoryCommitsShaStatuses", "method": "GET",
     "path": "/projects/{id}/repository/commits/{sha}/statuses", "path_params": {**_ID, "sha": _S},
     "query": {"ref": _S, "stage": _S, "name": _S, "pipeline_id": _I, "all": _B,
               "order_by": {"type": "string", "enum": ["id", "pipeline_id"]},
               "sort": {"type": "string", "enum": ["asc", "desc"]}, **_PAGE},
     "responses": {"200": _list("CommitStatus"), "401": ANY, "404": ANY}},
    {"id": "getApiV4ProjectsIdPipelines", "method": "GET", "path": "/projects/{id}/pipelines",
     "path_params": _ID,
     "query": {"sha": _S, "ref": _S, "status": _S, "source": _S, "scope": _S, "username": _S,
               "order_by": {"type": "string", "enum": ["id", "status", "ref", "updated_at", "user_id"]},
               "sort": {"type": "string", "enum": ["asc", "desc"]}, **_PAGE},
     "responses": {"200": _list("PipelineBasic"), "401": ANY, "403": ANY, "404": ANY}},
]
