#pragma once

#include "high/high.h"
#include "low/other.h"
