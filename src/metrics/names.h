/* The names of the metric families more than one module uses (the one that updates a series and
 * the status page that shows it), spelled once. Every family is listed in docs/metrics.md. */
#ifndef DT_METRICS_NAMES_H
#define DT_METRICS_NAMES_H

#define DT_M_GLOBAL_STEP "dtrain_global_step"
#define DT_M_TOTAL_STEPS "dtrain_total_steps"
#define DT_M_LOCAL_STEPS "dtrain_local_steps_total"
#define DT_M_EXAMPLES "dtrain_examples_total"
#define DT_M_EXAMPLES_PER_SEC "dtrain_examples_per_second"
#define DT_M_STEPS_PER_SEC "dtrain_steps_per_second"
#define DT_M_TRAIN_LOSS "dtrain_train_loss"
#define DT_M_TRAIN_ACC "dtrain_train_accuracy"
#define DT_M_VAL_LOSS "dtrain_validation_loss"
#define DT_M_VAL_ACC "dtrain_validation_accuracy"
#define DT_M_VAL_AUC "dtrain_validation_auc"
#define DT_M_STALE "dtrain_stale_gradients_total"
#define DT_M_MEMORY "dtrain_process_resident_memory_bytes"
#define DT_M_PS_LIVE_WORKERS "dtrain_ps_live_workers"
#define DT_M_PS_PUSHES "dtrain_ps_pushes_total"
#define DT_M_PS_PULLS "dtrain_ps_pulls_total"
/* Families registered by both the ps and the ps client: one help text. */
#define DT_M_SENT "dtrain_sent_bytes_total"
#define DT_M_SENT_HELP "Bytes of messages sent, headers and payloads (a ps counts its parameter replies)."
#define DT_M_RECEIVED "dtrain_received_bytes_total"
#define DT_M_RECEIVED_HELP "Bytes of messages received, headers and payloads."

#endif
