/*
 * log.h - owns how Guanaco talks to the user: one prefix ("guanaco: "), info
 * lines that GUANACO_LOG=0 silences, and errors that are never silenced.
 */
#ifndef GUANACO_LOG_H
#define GUANACO_LOG_H

#include <stdbool.h>

void guanaco_log_set_enabled(bool enabled);
bool guanaco_log_enabled(void);

__attribute__((format(printf, 1, 2))) void guanaco_log_info(const char *format, ...);
__attribute__((format(printf, 1, 2))) void guanaco_log_error(const char *format, ...);

#endif
