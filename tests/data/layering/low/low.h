#pragma once

#include <vector>

#include "high/high.h"
#include "low/other.h"
#include "other_neighbour.h"
#include "third_party/not_a_project_folder.h"
