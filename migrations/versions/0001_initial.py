"""Initial tables: graphs, clusters, jobs, steps, results, profiles, keys, checkpoints

Revision ID: 0001
Revises:
Create Date: 2026-11-22 15:45:19.630539
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.String(length=200), nullable=False),
        sa.Column("rate_limit_per_minute", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "blobs",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )
    op.create_table(
        "clusters",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_clusters_fingerprint"), ["fingerprint"], unique=False)

    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("blob_digest", sa.String(length=64), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["blob_digest"],
            ["blobs.digest"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "graphs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("blob_digest", sa.String(length=64), nullable=False),
        sa.Column("num_nodes", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["blob_digest"],
            ["blobs.digest"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("graphs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_graphs_fingerprint"), ["fingerprint"], unique=False)

    op.create_table(
        "profiles",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("blob_digest", sa.String(length=64), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["blob_digest"],
            ["blobs.digest"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("graph_id", sa.String(length=64), nullable=False),
        sa.Column("cluster_id", sa.String(length=64), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=True),
        sa.Column("batch_inputs", sa.JSON(), nullable=True),
        sa.Column("loss", sa.String(length=500), nullable=True),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=True),
        sa.Column("iterations", sa.Integer(), nullable=False),
        sa.Column("best_step_time_s", sa.Float(), nullable=True),
        sa.Column("best_speedup", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("api_key_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("latency_s", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
        ),
        sa.ForeignKeyConstraint(
            ["graph_id"],
            ["graphs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_key"), ["key"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_status"), ["status"], unique=False)

    op.create_table(
        "job_steps",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("step", sa.String(length=32), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "step"),
    )
    op.create_table(
        "results",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("graph_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("cluster_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("device_map", sa.JSON(), nullable=True),
        sa.Column("graphdef_digest", sa.String(length=64), nullable=True),
        sa.Column("trace_digest", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["graphdef_digest"],
            ["blobs.digest"],
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["trace_digest"],
            ["blobs.digest"],
        ),
        sa.PrimaryKeyConstraint("job_id"),
    )
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.create_index(
            "ix_results_cache", ["graph_fingerprint", "cluster_fingerprint"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_index("ix_results_cache")

    op.drop_table("results")
    op.drop_table("job_steps")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_status"))
        batch_op.drop_index(batch_op.f("ix_jobs_key"))
        batch_op.drop_index(batch_op.f("ix_jobs_created_at"))

    op.drop_table("jobs")
    op.drop_table("profiles")
    with op.batch_alter_table("graphs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_graphs_fingerprint"))

    op.drop_table("graphs")
    op.drop_table("checkpoints")
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_clusters_fingerprint"))

    op.drop_table("clusters")
    op.drop_table("blobs")
    op.drop_table("api_keys")
