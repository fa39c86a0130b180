// PD_RETURN_IF_ERROR / PD_ASSIGN_OR_RETURN: early return on a non-OK absl::Status(Or).
//
// Debian's Abseil 20220623 ships no status macros; upstream added ABSL_RETURN_IF_ERROR in 2026.
// Switch to those when we upgrade (one sed over the tree).
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) once; returns it from the enclosing function if not OK.
#define PD_RETURN_IF_ERROR(expr)                      \
  do {                                                \
    ::absl::Status pd_status_internal_ = (expr);      \
    if (!pd_status_internal_.ok()) {                  \
      return pd_status_internal_;                     \
    }                                                 \
  } while (false)

#define PD_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define PD_STATUS_MACROS_CONCAT_(a, b) PD_STATUS_MACROS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, otherwise moves the
// value into `lhs`, which may be a declaration (`auto x`) or an existing lvalue.
#define PD_ASSIGN_OR_RETURN(lhs, rexpr) \
  PD_ASSIGN_OR_RETURN_IMPL_(PD_STATUS_MACROS_CONCAT_(pd_statusor_, __LINE__), lhs, rexpr)

#define PD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) {                                 \
    return std::move(statusor).status();                \
  }                                                     \
  lhs = *std::move(statusor)
